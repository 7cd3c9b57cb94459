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
an exercise is about can carry most of its points. What a failing test's code printed
(the submission's prints, on every rank) comes back with it, its last
:data:`OUTPUT_CHARS` characters.

Each test's message is the whole exception its test raised (the ``E`` lines of
pytest's report, without pytest's own prefixes, locations or notes); an
exercise's *first failure* is one line of its first failing test's message, cut
only between values (never inside a tensor, list or word) with a note of what
it left out.
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
from . import procs
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
#: The width of a first-failure line (its message part), and the most a test's whole message
#: keeps (a submission can raise an exception of any size).
LINE_CHARS = 300
MESSAGE_CHARS = 20_000
#: The most of a failing test's printed output kept (its end: the last prints before it failed).
OUTPUT_CHARS = 4_000


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
    """One line of ``text`` (a process's output): its first ``E`` line, else its first line."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    pick = next((ln[1:].strip() for ln in lines if ln.startswith("E ")), lines[0] if lines else "")
    return one_line(_drop_module_path(pick), whole=None)


def _drop_module_path(text: str) -> str:
    return re.sub(r"^(?:[A-Za-z_]\w*\.)+(\w+: )", r"\1", text)   # a.b.Error: -> Error:


def _boundaries(text: str) -> list[int]:
    """Where ``text`` may be cut: at a space outside every bracket, so a tensor, a list, a
    call or a word is shown whole or not at all."""
    depth, cuts = 0, []
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch.isspace() and depth == 0:
            cuts.append(i)
    return cuts + [len(text)]


def one_line(message: str, width: int = LINE_CHARS,
             whole: str | None = "--json, Gradescope's output") -> str:
    """``message`` as one line of at most about ``width`` characters, cut only between values,
    with a note of what it leaves out (and where the ``whole`` message is). Its lines are
    joined with `` | `` up to a traceback (the submission's own) or, after a test's own
    words, pytest's explanation of the assertion (``assert ...``): the message keeps both."""
    lines = [ln.strip() for ln in (message or "").splitlines() if ln.strip()]
    head = lines[:1] + list(itertools.takewhile(
        lambda ln: not ln.startswith(("---", "Traceback (", "assert ")), lines[1:]))
    text = " | ".join(head)
    cuts = _boundaries(text)
    fit = [c for c in cuts if c <= width]
    ends = [c for c in fit if text.startswith(" | ", c) or c == len(text)]
    longer = next((c for c in cuts if c > width), len(text))
    if len(text) <= width:
        cut = len(text)
    elif ends and ends[-1] >= width // 2:   # rather a whole line than a line's first words
        cut = ends[-1]
    elif fit and fit[-1] >= width // 2:
        cut = fit[-1]
    elif longer <= 4 * width:             # the next value is long: shown whole all the same
        cut = longer
    else:                                 # a value longer still: not shown at all
        cut = fit[-1] if fit else 0
    shown = text[:cut].rstrip()
    rest = len(text) - len(shown) + sum(len(ln) + 1 for ln in lines[len(head):])
    if rest <= 0:
        return shown
    more = len(lines) - len(head) + (text[cut:].count(" | ") if cut < len(text) else 0)
    lines_note = f" ({more} more line{'s' if more != 1 else ''})" if more else ""
    where = f"; the whole message: {whole}" if whole else ""
    return f"{shown} ... [+{rest} characters{lines_note} not shown{where}]"


def _message(bad) -> str:
    """The whole message of a failed test: the exception pytest reports (its last block of
    ``E`` lines), without pytest's prefixes, file locations or notes of its own."""
    lines = (bad.text or "").splitlines()
    ends = [i for i, ln in enumerate(lines) if re.match(r"E( |$)", ln)]
    if ends:
        last = ends[-1]
        first = last
        while first > 0 and re.match(r"E( |$)", lines[first - 1]):
            first -= 1
        filled = next((ln for ln in lines[first:last + 1] if ln.strip() != "E"), "E")
        prefix = re.match(r"E *", filled).group(0)
        block = [ln[len(prefix):] if ln.startswith(prefix) else ln[1:].strip()
                 for ln in lines[first:last + 1]]
    else:                                 # no report text: the attribute, less pytest's note
        attr = bad.get("message", "") or ""
        block = re.sub(r"(\.\.\.)?\n\[(\+\d+ more lines?|truncated); full report in element "
                       r"text\]$", "", attr).splitlines()
    block = [ln.rstrip() for ln in block
             if not re.match(r"\s*(Use -v to get (more|the full) diff|\.\.\.Full output "
                             r"truncated)", ln)]
    text = "\n".join(block).strip("\n")
    text = _drop_module_path(text)
    if len(text) > MESSAGE_CHARS:
        cut = text.rfind("\n", 0, MESSAGE_CHARS)
        cut = cut if cut > MESSAGE_CHARS // 2 else MESSAGE_CHARS
        text = f"{text[:cut]}\n[+{len(text) - cut} more characters of this message not kept]"
    return text


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
                          + _first_line(tail.since(0)[-2000:]))
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
        message = "" if bad is None else _message(bad)
        if case.find("skipped") is not None:
            message = "skipped"
        cases.append({"name": case.get("name"), "passed": ok, "weight": weight,
                      "message": message, "output": "" if ok else _output(case)})
        if bad is not None and not first:
            first = f"{case.get('name')}: {one_line(message)}"
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


def _output(case) -> str:
    """What a test printed (its ``system-out``): the last :data:`OUTPUT_CHARS` characters,
    from a line's start, with a note of what was cut."""
    text = "".join(el.text or "" for el in case.iter("system-out"))
    text = re.sub(r"(?m)^-+ Captured [\w ]+ -+\n?", "", text).strip("\n")   # pytest's headers
    if len(text) <= OUTPUT_CHARS:
        return text
    cut = text.find("\n", len(text) - OUTPUT_CHARS)
    cut = cut + 1 if 0 <= cut < len(text) - OUTPUT_CHARS // 2 else len(text) - OUTPUT_CHARS
    return f"[... {cut} earlier characters of output not kept ...]\n{text[cut:]}"


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
    """Grade a folder of ``exNN_*.py`` files, or one such file (see :func:`submitted_files`)."""
    files = submitted_files(path)
    extra = Path(extra) if extra else None
    return [grade_file(f, extra, timeout) for f in files]
