"""Grade a student's folder: each exercise's tests in a pytest process of its own.

For each ``exNN_*.py`` the grader runs the pack's ``tests/exercises/test_exNN_*.py``
(and ``--extra-tests DIR/test_exNN*.py``) in a fresh pytest process with a
wall-time limit and ``LECTURE_EXERCISE_PATH`` naming the student's file. That
process imports only the tests and the pack; the tests reach the student's code
through :mod:`.harness` (a sandboxed child per exercise). The grader reads
pytest's JUnit XML only when pytest ended normally (exit code 0 or 1), so a
test process that was killed scores 0, and after each exercise it kills every
process left below it (it is a child subreaper, so orphans come back to it).
A test file may set ``POINTS = n`` (default 10), awarded in proportion to the
tests passed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from .. import zygote
from ..exercises import ROOT, exercise_id
from ..launch import worker_pids
from . import procs
from .sandbox import _Tail

TESTS = ROOT / "tests" / "exercises"
DEFAULT_POINTS = 10
#: Plugins the exercise tests do not use, kept out of each grading process: the cache, xdist,
#: and nbval (importing it imports nbformat and jsonschema's format checkers, seconds of CPU
#: per process).
NO_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:nbval")


@dataclass
class Result:
    exercise: str
    file: str
    passed: int
    total: int
    points: float
    max_points: int
    first_failure: str
    tests: list = field(default_factory=list)   # per test: name, passed, message, detail


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
    pick = next((ln[1:].strip() for ln in lines if ln.startswith("E ")), lines[0] if lines else "")
    return re.sub(r"^(?:[A-Za-z_]\w*\.)+(\w+: )", r"\1", pick)[:200]   # drop module paths


def grade_file(student_file: Path, extra: Path | None = None, timeout: float = 300) -> Result:
    """Run exercise tests for one student file in a fresh pytest process."""
    ex = exercise_id(student_file)
    files = _test_files(ex, extra)
    points = _points(files)
    if not files:
        return Result(ex, str(student_file), 0, 0, 0.0, points, "no tests found for " + ex)
    procs.become_subreaper()
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "report.xml"
        env = dict(os.environ, LECTURE_EXERCISE_PATH=str(Path(student_file).resolve()),
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "pytest", "-q", *NO_PLUGINS,
               "-p", "lecture_lib.grading.plugin", f"--junitxml={xml}", f"--rootdir={ROOT}",
               *map(str, files)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        since = procs.start_time(proc.pid)
        tail = _Tail(proc.stdout, 64 * 1024)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        keep = set(worker_pids()) | set(zygote.pids())      # ours: warm workers, their zygote
        procs.end_all([proc.pid], keep=keep, since=since)   # it and all below it
        proc.wait()
        tail.thread.join(timeout=5)
        proc.stdout.close()
        if code is None:
            return Result(ex, str(student_file), 0, 0, 0.0, points,
                          f"{ex}: timed out: exceeded the wall-time limit of {timeout:g} s "
                          "(a hang?)")
        if code not in (0, 1) or not xml.exists():
            why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            return Result(ex, str(student_file), 0, 0, 0.0, points,
                          f"the tests' process ended abnormally ({why}): "
                          + _first_line(tail.since(0)[-2000:]))
        return _from_junit(ex, student_file, xml, points)


def _from_junit(ex: str, student_file: Path, xml: Path, points: int) -> Result:
    passed, total, first, cases = 0, 0, "", []
    for case in ET.parse(xml).getroot().iter("testcase"):
        total += 1
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        ok = bad is None and case.find("skipped") is None
        passed += ok
        message = "" if bad is None else _first_line(bad.get("message", "") + "\n"
                                                     + (bad.text or ""))
        if case.find("skipped") is not None:
            message = "skipped"
        detail = "" if bad is None else (bad.get("message", "") or "")[:2000]
        cases.append({"name": case.get("name"), "passed": ok, "message": message,
                      "detail": detail})
        if bad is not None and not first:
            first = f"{case.get('name')}: {message}"
    if total == 0:
        # collection failed: pytest reports it as an error testcase or none at all
        first = first or "no test ran (the file failed to import?)"
    score = round(points * passed / total, 2) if total else 0.0
    return Result(ex, str(student_file), passed, total, score, points, first, cases)


def grade(path: str | Path, extra: str | Path | None = None, timeout: float = 300) -> list[Result]:
    """Grade a folder of ``exNN_*.py`` files, or one such file."""
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
