"""``python -m lecture_lib.grading``: the one command line for grading, releases and stubs.

    python -m lecture_lib.grading grade PATH      grade a student's exercises (:mod:`.runner`)
    python -m lecture_lib.grading release DIR     write the folder students get (:mod:`.release`)
    python -m lecture_lib.grading stubs           write exercises/ from solutions/ (:mod:`.stubs`)

and :func:`check`, which grades one exercise from a student's own notebook.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import release as releasing
from . import stubs
from .report import nothing_to_grade, printed_by_failing_tests, table, write_gradescope, write_json
from .runner import Result, grade, grade_file

PROG = "python -m lecture_lib.grading"


def check(ex: str, folder: str | Path = stubs.EXERCISES, timeout: float = 300) -> Result:
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
        if failed.get("output"):
            print("\nwhat your code printed during it:\n" + failed["output"])
    return result


def main(argv=None) -> int:
    """Run one command (``grade``, ``release`` or ``stubs``); return its exit status."""
    args = _parser().parse_args(argv)
    return args.command(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Grade a student's exercises, "
                                     "write the student release, generate the exercise stubs.")
    commands = parser.add_subparsers(metavar="COMMAND", required=True)
    grading = commands.add_parser("grade", help="grade a student's exercises",
                                  description="Grade a student's exercises.")
    grading.add_argument("path", help="a folder of exNN_*.py files, or one such file")
    grading.add_argument("--json", metavar="FILE",
                         help="also write the results as JSON (each test's whole message)")
    grading.add_argument("--gradescope", metavar="FILE",
                         help="also write Gradescope's results.json to FILE")
    grading.add_argument("--visibility", default="visible",
                         choices=["visible", "hidden", "after_due_date", "after_published"],
                         help="Gradescope visibility of each exercise's result")
    grading.add_argument("--extra-tests", metavar="DIR", help="an instructor's private tests")
    grading.add_argument("--timeout", type=float, default=300,
                         help="seconds per exercise before it scores 0 (default 300)")
    grading.set_defaults(command=_grade)
    release = commands.add_parser("release", help="write the folder students get",
                                  description="Write the folder students get.")
    release.add_argument("dir", help="where to write it (new or empty)")
    release.add_argument("--private", action="append", default=[], metavar="DIR",
                         help="a folder never to release (e.g. your --extra-tests)")
    release.set_defaults(command=_release)
    stubbing = commands.add_parser("stubs", help="write exercises/ from solutions/",
                                   description="Generate exercises/ from solutions/.")
    stubbing.add_argument("--check", action="store_true",
                          help="change nothing; exit 1 if exercises/ is stale")
    stubbing.set_defaults(command=_stubs)
    return parser


def _grade(args) -> int:
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
    printed = printed_by_failing_tests(results)
    if printed:
        print("\n" + printed)
    if args.json:
        write_json(results, args.json)
    if args.gradescope:
        write_gradescope(results, args.gradescope, args.visibility)
    return 0


def _release(args) -> int:
    try:
        released = releasing.release(args.dir, args.private)
    except ValueError as err:
        print(f"{PROG} release: {err}", file=sys.stderr)
        return 2
    print(f"wrote {len(released)} files to {args.dir}: the course as students get it (notebooks, "
          "exercise stubs, the library, its tests and the exercises' tests, examples, "
          "tools/" + " and tools/".join(releasing.TOOLS) + ", a README for students)")
    print("left out: " + ", ".join(releasing.left_out(released) + [str(p) for p in args.private]))
    return 0


def _stubs(args) -> int:
    if args.check:
        bad = stubs.stale()
        if bad:
            print(f"stale exercise stubs (run `{PROG} stubs`):", *bad)
            return 1
        print("exercise stubs are up to date")
        return 0
    print("wrote", *stubs.write())
    return 0
