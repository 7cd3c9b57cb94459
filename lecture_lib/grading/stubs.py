"""Exercise stubs are generated from the worked solutions: one source of truth.

A solution file ``solutions/exNN_topic.py`` marks what the student writes::

    def ring_sum(tensor):
        # BEGIN SOLUTION
        ...the answer...
        # END SOLUTION

``python -m lecture_lib.grading stubs`` writes ``exercises/exNN_topic.py`` with
each marked block replaced by ``raise NotImplementedError(...)`` (at the
block's indentation); ``--check`` changes nothing and exits 1 when any
generated file is stale, so CI catches a solution edited without
regenerating. A ``# STUB: code`` line inside a block puts ``code`` in the stub
instead of the raise (for a skeleton the student completes).
"""
from __future__ import annotations

import re
from pathlib import Path

#: The course pack's folders (the checkout's, or a release's: the one this library is in).
ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
_NAME = re.compile(r"^(ex\d\d)_\w+\.py$")
_BEGIN = re.compile(r"^(\s*)# BEGIN SOLUTION\s*$")
_END = re.compile(r"^\s*# END SOLUTION\s*$")
_STUB = re.compile(r"^\s*# STUB: ?(.*)$")

HEADER = ('# Generated from solutions/{name} by `python -m lecture_lib.grading stubs`.\n'
          '# Students: fill in every NotImplementedError below, then check your work with\n'
          '#   python -m lecture_lib.grading grade exercises/{name}\n')


def exercise_id(path: Path | str) -> str | None:
    """'ex00' for 'ex00_ring_sum.py', None for any other file name."""
    m = _NAME.match(Path(path).name)
    return m.group(1) if m else None


def make_stub(source: str, exercise: str = "exercise") -> str:
    """The solution source with each marked block replaced by its stub."""
    out, inside, indent, stub = [], False, "", []
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        if not inside and (m := _BEGIN.match(line)):
            inside, indent, stub = True, m.group(1), []
        elif inside and _END.match(line):
            inside = False
            out += stub or [f'{indent}raise NotImplementedError("{exercise}: '
                            f'your code here")\n']
        elif inside:
            if m := _STUB.match(line):
                stub.append(f"{indent}{m.group(1)}\n")
        elif "# BEGIN SOLUTION" in line or "# END SOLUTION" in line:
            raise ValueError(f"line {number}: unmatched solution marker")
        else:
            out.append(line)
    if inside:
        raise ValueError("a '# BEGIN SOLUTION' has no '# END SOLUTION'")
    return "".join(out)


def generated() -> dict[Path, str]:
    """What ``exercises/`` should hold: one stub per solution file."""
    files = {}
    for solution in sorted(SOLUTIONS.glob("ex*.py")):
        ex = exercise_id(solution)
        if ex is None:
            continue
        source = solution.read_text()
        if "# BEGIN SOLUTION" not in source:
            raise ValueError(f"{solution.name} marks no solution block")
        files[EXERCISES / solution.name] = (HEADER.format(name=solution.name)
                                            + make_stub(source, ex))
    return files


def stale() -> list[str]:
    """Generated files that are missing, outdated, or left over."""
    want = generated()
    bad = [p.name for p, text in want.items() if not p.exists() or p.read_text() != text]
    bad += [p.name for p in EXERCISES.glob("ex*.py") if p not in want]
    return sorted(bad)


def write() -> list[str]:
    EXERCISES.mkdir(exist_ok=True)
    want = generated()
    for p in EXERCISES.glob("ex*.py"):
        if p not in want:
            p.unlink()
    for p, text in want.items():
        p.write_text(text)
    return sorted(p.name for p in want)

