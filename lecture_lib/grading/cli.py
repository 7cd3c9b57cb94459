"""``python -m lecture_lib.grade PATH``, and ``check`` for a student's own notebook."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..exercises import EXERCISES
from .report import nothing_to_grade, table, write_gradescope, write_json
from .runner import Result, grade, grade_file


def check(ex: str, folder: str | Path = EXERCISES, timeout: float = 300) -> Result:
    """Grade one exercise of ``folder`` (a student's own check, e.g. from a notebook): the
    table's line, then the whole message of the first failing test."""
    matches = sorted(Path(folder).glob(f"{ex}_*.py"))
    if not matches:
        raise FileNotFoundError(f"no file {ex}_*.py in {folder}")
    result = grade_file(matches[0], None, timeout)
    print(table([result]))
    failed = next((t for t in result.tests if not t["passed"] and t["message"] != "skipped"),
                  None)
    if failed is not None:
        print(f"\n{failed['name']}:\n{failed['message']}")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lecture_lib.grade",
                                     description="Grade a student's exercises.")
    parser.add_argument("path", help="a folder of exNN_*.py files, or one such file")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the results as JSON (each test's whole message)")
    parser.add_argument("--gradescope", metavar="FILE",
                        help="also write Gradescope's results.json to FILE")
    parser.add_argument("--visibility", default="visible",
                        choices=["visible", "hidden", "after_due_date", "after_published"],
                        help="Gradescope visibility of each exercise's result")
    parser.add_argument("--extra-tests", metavar="DIR", help="an instructor's private tests")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds per exercise before it scores 0 (default 300)")
    args = parser.parse_args(argv)
    try:
        results = grade(args.path, args.extra_tests, args.timeout)
    except (FileNotFoundError, ValueError) as exc:
        if not args.gradescope:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        # Gradescope shows the student results.json, not our stderr: say it there
        why = ("Nothing was graded: the submission holds no exercise file. Submit your "
               "exercises/exNN_*.py files under their own names (ex00_ring_sum.py, ...).")
        write_gradescope(nothing_to_grade(why, args.visibility), args.gradescope)
        print(f"error: {exc}", file=sys.stderr)
        return 0
    print(table(results))
    if args.json:
        write_json(results, args.json)
    if args.gradescope:
        write_gradescope(results, args.gradescope, args.visibility)
    return 0
