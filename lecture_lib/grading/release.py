"""The student release: the folder an instructor hands out, a course of its own without the answers.

``python -m lecture_lib.grading release DIR`` writes into DIR (which must not exist, or
be empty) what a student needs to follow the course, do the exercises and run
the README's commands: the notebooks, the exercise stubs, the library and its
tests, the exercises' tests (students grade their own work with them), the
examples, the tools ``make course`` and ``make render`` run, the Makefile and
the install files, and a README written for students (:func:`student_readme`).

It copies from an allowlist, so ``solutions/``, the grader's own tests
(``tests/test_grading*.py``, the tampering submissions, this module's test: they
grade the solutions or build releases), CI, the contributors' guide, the
browser test and anything else (an instructor's private tests, wherever they
live) never reach it; ``--private DIR`` names a folder to refuse outright even
if it sits inside a copied one. Before writing it checks that the stubs are
fresh (generated from the current solutions); after writing, that no released
file holds a solution's text and that the README names nothing the release
lacks.

In the release, ``make test`` passes ``-p lecture_lib.grading.release`` to pytest:
an exercise's tests are then skipped, saying what to do, while the student's
file still raises the stub's ``NotImplementedError`` (:func:`pytest_collection_modifyitems`).
The grader (``python -m lecture_lib.grading grade``) does not load this plugin: there an
unwritten stub fails, and scores 0, with that ``NotImplementedError`` as its first failure.
"""
from __future__ import annotations

import glob
import re
import shutil
from pathlib import Path

from .stubs import EXERCISES, ROOT, SOLUTIONS, exercise_id, stale

#: Copied as they are (README.md is written: see :func:`student_readme`).
FILES = ("pyproject.toml", "Makefile", "environment.yml", ".gitignore", "conftest.py")
FOLDERS = ("lecture_lib", "notebooks", "exercises", "examples", "tests", "tools", "book")
#: From tools/, what the Makefile runs: ``make course``, ``make render`` and ``make book``.
TOOLS = ("course.py", "render_notebooks.py", "book.py")
SKIP_NAMES = ("__pycache__", ".ipynb_checkpoints", ".pytest_cache", "*.pyc", "*.egg-info")
#: The tests only the instructor's checkout can run: the grader's (they grade the solutions,
#: and show how to defeat a naive grader), the Gradescope recipe's and the release's own (they
#: build releases). The
#: Makefile's INSTRUCTOR_TESTS runs them there; tests/test_release.py checks the two agree.
SKIP_TESTS = ("test_grading*.py", "tamper_routes.py", "grading_users.py", "test_gradescope.py",
              "test_release.py")
#: The sections of README.md (by the start of their ``## `` heading) the release's README leaves
#: out: README.md is written for students, but for this one pointer to the instructors' docs.
INSTRUCTOR_SECTIONS = ("For instructors and maintainers",)
#: A path into the pack, as README.md names one (``exercises/exNN_*.py``, ``notebooks/<nb>.ipynb``).
_PATH = re.compile(r"(?<![\w./-])((?:lecture_lib|notebooks|exercises|examples|tests|tools|solutions"
                   r"|\.ci)(?:/[\w.*<>-]*)*)")
_STUB_RAISE = 'raise NotImplementedError("{ex}: your code here")'
_UNWRITTEN = "stub not implemented yet"


def _ignore(private: list[Path]):
    def ignore(folder: str, names: list[str]) -> set[str]:
        here = Path(folder).resolve()
        skip = set(shutil.ignore_patterns(*SKIP_NAMES)(folder, names))
        if here == (ROOT / "tests").resolve():
            skip |= set(shutil.ignore_patterns(*SKIP_TESTS)(folder, names))
            skip |= {n for n in names if (here / n).is_dir() and n != "exercises"}
        if here == (ROOT / "tools").resolve():
            skip |= {n for n in names if n not in TOOLS}
        skip |= {n for n in names if any((here / n).resolve() == p for p in private)}
        return skip
    return ignore


def release(target: str | Path, private: list[str | Path] = ()) -> list[str]:
    """Write the student release into ``target``; return the released paths (relative)."""
    target = Path(target)
    if not SOLUTIONS.is_dir():
        raise ValueError(f"no {SOLUTIONS.name}/ in {ROOT}: this is a student's copy already; "
                         "write a release from the instructor's checkout")
    if target.exists() and any(target.iterdir()):
        raise ValueError(f"{target} exists and is not empty")
    if (bad := stale()):
        raise ValueError(f"stale exercise stubs {bad}: run `python -m lecture_lib.grading stubs`")
    readme = student_readme((ROOT / "README.md").read_text())
    private = [Path(p).resolve() for p in private]
    target.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, target / name)
    for name in FOLDERS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, target / name, ignore=_ignore(private))
    (target / "README.md").write_text(readme)
    released = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    _check(target, released)
    return released


def _sections(readme: str) -> dict[str, str]:
    """README.md's ``## `` sections (each with its ``###`` subsections), by heading."""
    parts, fence = {}, False
    heading, lines = None, []
    for line in readme.splitlines(keepends=True):
        fence ^= line.startswith("```")
        if not fence and line.startswith("## "):
            if heading:
                parts[heading] = "".join(lines)
            heading, lines = line[3:].strip(), []
        lines.append(line)
    if heading:
        parts[heading] = "".join(lines)
    return parts


def student_readme(readme: str) -> str:
    """The release's README.md: ``readme`` without its :data:`INSTRUCTOR_SECTIONS` (they point
    at documents the release leaves out)."""
    sections = _sections(readme)
    first = readme.find("\n## ")
    out = [readme if first < 0 else readme[:first + 1]]
    for heading, text in sections.items():
        if not heading.startswith(INSTRUCTOR_SECTIONS):
            out.append(text)
    return "".join(out).rstrip() + "\n"


def absent_names(text: str, root: Path) -> list[str]:
    """The paths into the pack that ``text`` names and ``root`` lacks (``exNN`` and ``<...>``
    read as wildcards), and ``solutions`` wherever it is named."""
    missing = []
    for name in sorted(set(_PATH.findall(text))):
        name = name.rstrip(".")
        pattern = re.sub(r"<[^>]*>", "*", name.replace("NN", "??"))
        if name.startswith("solutions") or not glob.glob(str(root / pattern)):
            missing.append(name)
    if re.search(r"\bsolutions?\b", text, re.I) and not any(m.startswith("solutions")
                                                            for m in missing):
        missing.append("solutions (the word)")
    return missing


def _check(target: Path, released: list[str]) -> None:
    """No solution file, no released file that holds a solution's worked lines, and a README
    that names nothing the release lacks."""
    answers = [s.read_text() for s in SOLUTIONS.glob("ex*.py")]
    for rel in released:
        if rel.startswith("solutions"):
            raise RuntimeError(f"{rel}: a solution reached the release")
        if rel.endswith(".py") and (target / rel).read_text(errors="replace") in answers:
            raise RuntimeError(f"{rel} is a copy of a solution")
    assert (target / "exercises").is_dir() and EXERCISES.is_dir()
    if (missing := absent_names((target / "README.md").read_text(), target)):
        raise RuntimeError(f"the release's README.md names what the release lacks: {missing} "
                           "(README.md, outside its instructors' section)")


# -- the release's `make test`: exercises not written yet ------------------------------------

def unwritten(path: Path) -> list[int]:
    """The lines where exercise file ``path`` still raises its stub's NotImplementedError."""
    raise_line = _STUB_RAISE.format(ex=exercise_id(path))
    return [n for n, line in enumerate(path.read_text().splitlines(), 1) if raise_line in line]


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def pytest_collection_modifyitems(config, items):
    """Skip an exercise's tests, saying what to do, while its file still raises the stub's
    NotImplementedError (``make test`` loads this plugin; the grader does not)."""
    import pytest  # noqa: PLC0415  the plugin's own needs: writing a release needs no pytest

    from .harness import student_file  # noqa: PLC0415  imports torch: only when pytest runs

    reasons = {}
    for item in items:
        m = re.match(r"test_(ex\d\d)_\w+\.py$", item.path.name)
        if not m or item.path.parent.name != "exercises":
            continue
        ex = m.group(1)
        if ex not in reasons:
            try:
                path = student_file(ex)
            except FileNotFoundError:
                reasons[ex] = None                  # the test says so itself
                continue
            lines = unwritten(path)
            reasons[ex] = lines and (
                f"{_UNWRITTEN}: write {_shown(path)} (NotImplementedError at line "
                f"{', '.join(map(str, lines))}), then grade it with "
                f"`python -m lecture_lib.grading grade {_shown(path)}`")
        if reasons[ex]:
            item.add_marker(pytest.mark.skip(reason=reasons[ex]))


def pytest_terminal_summary(terminalreporter):
    """One line per exercise whose tests were skipped as not written yet."""
    found = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3 else ""
        reason = reason.removeprefix("Skipped: ")
        if reason.startswith(_UNWRITTEN):
            found[reason] = found.get(reason, 0) + 1
    if found:
        terminalreporter.section("exercises not written yet: their tests were skipped")
        for reason, count in sorted(found.items()):
            terminalreporter.write_line(f"{count:3d} tests: {reason}")


def left_out(released: list[str]) -> list[str]:
    """What the instructor's checkout holds and a release with files ``released`` does not
    (beside what git ignores: the venv, caches, build/)."""
    have = {Path(r).parts[0] for r in released} | {
        "/".join(Path(r).parts[:2]) for r in released}
    out = []
    for folder in (ROOT, ROOT / "tests", ROOT / "tools"):
        for p in sorted(folder.iterdir()):
            rel = str(p.relative_to(ROOT))
            hidden = p.name.startswith(".") and p.name != ".ci"
            if rel in have or hidden or p.name in ("build", "__pycache__") \
                    or p.name.endswith(".egg-info") or folder != ROOT and p.parent.name not in have:
                continue
            out.append(rel + "/" * p.is_dir())
    return out

