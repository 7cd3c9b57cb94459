"""Grade a student's folder: each exercise's tests in a pytest process of its own.

For each ``exNN_*.py`` the grader runs the pack's ``tests/exercises/test_exNN_*.py``
(and ``--extra-tests DIR/test_exNN*.py``) in a fresh pytest process with a
wall-time limit and ``LECTURE_EXERCISE_PATH`` naming the student's file. That
process imports only the tests and the pack; the tests reach the student's code
through :mod:`.harness` (a sandboxed child per exercise). The grader reads
pytest's JUnit XML only when pytest ended normally (exit code 0 or 1), so a
test process that was killed scores 0, and after each exercise it kills every
process left below it (it is a child subreaper, so orphans come back to it).

A test file may set ``POINTS = n`` (default 10), shared among its tests by their
weights (``@pytest.mark.weight(w)``, default 1; :mod:`.plugin`), so the tests of what
an exercise is about carry most of its points. Each test's message, the exercise's
first failure and what a failing test printed are shaped by :mod:`.messages`.

Before any submission runs, the grader chooses the isolation (:mod:`.isolation`), says it
once, and hashes what it reads (the tests, the library, the submitted files); after each
exercise it checks them, restores what changed and scores that exercise 0.
"""
from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime import worker_pids, zygote
from . import isolation, messages, procs
from .messages import first_line, one_line
from .sandbox import _Tail
from .stubs import EXERCISES, ROOT, exercise_id

TESTS = ROOT / "tests" / "exercises"
DEFAULT_POINTS = 10
#: Plugins the exercise tests do not use, kept out of each grading process: the cache, xdist,
#: and nbval (importing it imports nbformat and jsonschema's format checkers, seconds of CPU
#: per process).
NO_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:nbval")
#: Assertion explanations in full: without it pytest shortens them and says "use '-vv'".
FULL_ASSERTIONS = ("-o", "verbosity_assertions=2")
#: What a failing test printed, in the JUnit report (a passing test's output is not kept).
CAPTURED_OUTPUT = ("-o", "junit_logging=system-out", "-o", "junit_log_passing_tests=false")


@dataclass
class Result:
    exercise: str
    file: str
    passed: int
    total: int
    points: float
    max_points: int
    first_failure: str
    #: per test: name, passed, weight, message (whole), output (what it printed, when it failed)
    tests: list = field(default_factory=list)
    isolation: str = ""                  # what kept the submission from the grader's files


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


def grade_file(student_file: Path, extra: Path | None = None, timeout: float = 300,
               mode: str | None = None) -> Result:
    """Run exercise tests for one student file in a fresh pytest process, its sandbox isolated
    by ``mode`` (default: :func:`.isolation.choose`)."""
    mode = mode or isolation.choose()
    result = _run_tests(Path(student_file), extra, timeout, mode)
    result.isolation = mode
    return result


def _run_tests(student_file: Path, extra: Path | None, timeout: float, mode: str) -> Result:
    ex = exercise_id(student_file)
    files = _test_files(ex, extra)
    points = _points(files)
    if not files:
        return Result(ex, str(student_file), 0, 0, 0.0, points, "no tests found for " + ex)
    procs.become_subreaper()
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "report.xml"
        env = dict(os.environ, LECTURE_EXERCISE_PATH=str(student_file.resolve()),
                   OMP_NUM_THREADS="1", **{isolation.ENV: mode})
        cmd = [sys.executable, "-m", "pytest", "-q", *NO_PLUGINS, *FULL_ASSERTIONS,
               *CAPTURED_OUTPUT,
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
                          + first_line(tail.since(0)[-2000:]))
        return _from_junit(ex, student_file, xml, points)


def _from_junit(ex: str, student_file: Path, xml: Path, points: int) -> Result:
    passed, total, first, cases, earned, weights = 0, 0, "", [], 0.0, 0.0
    for case in ET.parse(xml).getroot().iter("testcase"):
        total += 1
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        ok = bad is None and case.find("skipped") is None
        weight = _weight(case)
        passed += ok
        earned += weight * ok
        weights += weight
        text = "" if bad is None else messages.message(bad)
        if case.find("skipped") is not None:
            text = "skipped"
        cases.append({"name": case.get("name"), "passed": ok, "weight": weight,
                      "message": text, "output": "" if ok else messages.output(case)})
        if bad is not None and not first:
            first = f"{case.get('name')}: {one_line(text)}"
    if total == 0:
        # collection failed: pytest reports it as an error testcase or none at all
        first = first or "no test ran (the file failed to import?)"
    score = round(points * earned / weights, 2) if weights else 0.0
    return Result(ex, str(student_file), passed, total, score, points, first, cases)


def _weight(case) -> float:
    """A test case's weight (its ``weight`` property, see :mod:`.plugin`), else 1."""
    for prop in case.iter("property"):
        if prop.get("name") == "weight":
            try:
                return max(float(prop.get("value")), 0.0)
            except (TypeError, ValueError):
                break
    return 1.0


def submitted_files(path: str | Path) -> list[Path]:
    """The exercise files to grade in ``path``: the file itself, or a folder's ``exNN_*.py``
    (or, when it has none, its ``exercises/`` folder's: a submission of the whole pack), one
    file per exercise, so that no exercise can be scored twice. Where a folder holds several
    files of one exercise, the one named as the pack's stub is graded (else the first by
    name), and the others are named on stderr."""
    path = Path(path)
    if path.is_file():
        if exercise_id(path) is None:
            raise ValueError(f"{path}: expected exercise files named exNN_topic.py")
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"no such file or folder: {path}")
    files = sorted(p for p in path.glob("ex*.py") if p.is_file() and exercise_id(p))
    if not files and (path / "exercises").is_dir():
        files = sorted(p for p in (path / "exercises").glob("ex*.py")
                       if p.is_file() and exercise_id(p))
    if not files:
        raise ValueError(f"{path}: expected exercise files named exNN_topic.py")
    chosen = []
    for ex, group in itertools.groupby(files, key=exercise_id):
        group = list(group)
        stub = [p for p in group if (EXERCISES / p.name).is_file()]
        pick = (stub or group)[0]
        if len(group) > 1:
            print(f"{ex}: grading {pick.name} only, of {', '.join(p.name for p in group)}",
                  file=sys.stderr)
        chosen.append(pick)
    return chosen


def grade(path: str | Path, extra: str | Path | None = None, timeout: float = 300) -> list[Result]:
    """Grade a folder of ``exNN_*.py`` files, or one such file (see :func:`submitted_files`).

    The isolation is chosen and said (stderr) once; what the grader reads is hashed first and
    checked after each exercise: an exercise that changed it scores 0, and it is restored."""
    files = submitted_files(path)
    extra = Path(extra) if extra else None
    mode = isolation.choose()
    print(isolation.announcement(mode), file=sys.stderr)
    guarded = isolation.Snapshot.take([TESTS, ROOT / "tests" / "conftest.py", ROOT / "lecture_lib",
                                       *([extra] if extra else []), *files])
    results = []
    for f in files:
        result = grade_file(f, extra, timeout, mode)
        changed = guarded.changed()
        if changed:
            guarded.restore(changed)
            names = ", ".join(_shown(p) for p in changed[:5]) + (" ..." if len(changed) > 5 else "")
            result = Result(result.exercise, result.file, 0, result.total, 0.0, result.max_points,
                            f"{result.exercise}: the submission changed files the grader reads "
                            f"({names}): scored 0; the files were restored", [], mode)
        results.append(result)
    return results


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)
