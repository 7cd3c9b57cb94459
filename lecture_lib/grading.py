"""The instructor's grader: run each exercise's tests against a student's code.

``python -m lecture_lib.grade PATH`` (PATH: a folder of ``exNN_*.py`` files,
or one such file) runs, for each exercise, the pack's tests
``tests/exercises/test_exNN_*.py`` (and any ``--extra-tests DIR`` files
named ``test_exNN*.py``) in a separate pytest process with a time limit,
with ``LECTURE_EXERCISE_PATH`` pointing at the student's file. A crash or a
hang scores 0 on that exercise only; the grader goes on. It prints a table
(exercise, tests passed, points, first failure) and writes JSON with
``--json FILE``.

Test files load the code under test with :func:`load_exercise`; each may set
``POINTS = n`` (default 10), awarded in proportion to the tests passed.
From a notebook, ``lecture_lib.grading.check("ex00")`` grades one exercise of
``exercises/``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

import cloudpickle

from .exercises import EXERCISES, ROOT, SOLUTIONS, exercise_id

TESTS = ROOT / "tests" / "exercises"
DEFAULT_POINTS = 10


def load_exercise(ex: str):
    """Import the code under test for exercise ``ex`` ('ex00').

    From ``$LECTURE_EXERCISE_PATH`` when it names that exercise's file, else from
    the folder ``$LECTURE_EXERCISE_DIR`` (default: the worked solutions). The
    module is sent to ranks by value, so rank functions can call it.
    """
    path = os.environ.get("LECTURE_EXERCISE_PATH")
    if not path or exercise_id(path) != ex:
        folder = Path(os.environ.get("LECTURE_EXERCISE_DIR", SOLUTIONS))
        matches = sorted(folder.glob(f"{ex}_*.py"))
        if not matches:
            raise FileNotFoundError(f"no file {ex}_*.py in {folder}")
        path = matches[0]
    name = f"exercise_{ex}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


@dataclass
class Result:
    exercise: str
    file: str
    passed: int
    total: int
    points: float
    max_points: int
    first_failure: str


def _test_files(ex: str, extra: Path | None) -> list[Path]:
    files = sorted(TESTS.glob(f"test_{ex}_*.py"))
    if extra is not None:
        files += sorted(extra.glob(f"test_{ex}*.py"))
    return files


def _points(files: list[Path]) -> int:
    for f in files:
        m = re.search(r"^POINTS\s*=\s*(\d+)", f.read_text(), re.M)
        if m:
            return int(m.group(1))
    return DEFAULT_POINTS


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    for ln in lines:                        # prefer the exception line pytest marks with 'E'
        if ln.startswith("E "):
            return ln[1:].strip()[:200]
    return lines[0][:200] if lines else ""


def grade_file(student_file: Path, extra: Path | None = None, timeout: float = 300) -> Result:
    """Run exercise tests for one student file in a fresh pytest process."""
    ex = exercise_id(student_file)
    files = _test_files(ex, extra)
    points = _points(files)
    if not files:
        return Result(ex, str(student_file), 0, 0, 0.0, points, "no tests found for " + ex)
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "report.xml"
        env = dict(os.environ, LECTURE_EXERCISE_PATH=str(student_file.resolve()),
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
               f"--junitxml={xml}", f"--rootdir={ROOT}", *map(str, files)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return Result(ex, str(student_file), 0, 0, 0.0, points,
                          f"timed out after {timeout:g} s (a hang?)")
        if not xml.exists():
            return Result(ex, str(student_file), 0, 0, 0.0, points,
                          "tests crashed: " + _first_line(out.decode(errors="replace")[-2000:]))
        return _from_junit(ex, student_file, xml, points)


def _from_junit(ex: str, student_file: Path, xml: Path, points: int) -> Result:
    passed, total, first = 0, 0, ""
    for case in ET.parse(xml).getroot().iter("testcase"):
        total += 1
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is None and case.find("skipped") is None:
            passed += 1
        elif bad is not None and not first:
            first = f"{case.get('name')}: " + _first_line(bad.get("message", "") + "\n"
                                                          + (bad.text or ""))
    if total == 0:
        # collection failed: pytest reports it as an error testcase or none at all
        first = first or "no test ran (the file failed to import?)"
    score = round(points * passed / total, 2) if total else 0.0
    return Result(ex, str(student_file), passed, total, score, points, first)


def grade(path: str | Path, extra: str | Path | None = None, timeout: float = 300) -> list[Result]:
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.glob("ex*.py") if exercise_id(p))
    else:
        raise FileNotFoundError(f"no such file or folder: {path}")
    if not files or any(exercise_id(f) is None for f in files):
        raise ValueError(f"{path}: expected exercise files named exNN_topic.py")
    extra = Path(extra) if extra else None
    return [grade_file(f, extra, timeout) for f in files]


def table(results: list[Result]) -> str:
    rows = [("exercise", "tests passed", "points", "first failure")]
    rows += [(r.exercise, f"{r.passed}/{r.total}", f"{r.points:g}/{r.max_points}",
              r.first_failure or "-") for r in results]
    got, best = sum(r.points for r in results), sum(r.max_points for r in results)
    rows.append(("total", "", f"{got:g}/{best}", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3]
                     for row in rows)


def check(ex: str, folder: str | Path = EXERCISES, timeout: float = 300) -> Result:
    """Grade one exercise of ``folder`` (a student's own check, e.g. from a notebook)."""
    matches = sorted(Path(folder).glob(f"{ex}_*.py"))
    if not matches:
        raise FileNotFoundError(f"no file {ex}_*.py in {folder}")
    result = grade_file(matches[0], None, timeout)
    print(table([result]))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lecture_lib.grade",
                                     description="Grade a student's exercises.")
    parser.add_argument("path", help="a folder of exNN_*.py files, or one such file")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--extra-tests", metavar="DIR", help="an instructor's private tests")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds per exercise before it scores 0 (default 300)")
    args = parser.parse_args(argv)
    results = grade(args.path, args.extra_tests, args.timeout)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0
