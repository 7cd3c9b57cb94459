"""The student release: the folder an instructor hands out, without the answers.

``python -m lecture_lib.release DIR`` writes into DIR (which must not exist, or
be empty): the notebooks, the exercise stubs, the library, its tests, the
examples and the files that install and run them. It copies from an allowlist,
so ``solutions/``, the grader's own tests (``tests/test_grading*.py`` and the
tampering submissions), CI, and anything else (an instructor's private tests,
wherever they live) never reach it; ``--private DIR`` names a folder to refuse
outright even if it sits inside a copied one. Before writing it checks that
the stubs are fresh (generated from the current solutions), and after writing
that no released file holds a solution's text.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ..exercises import EXERCISES, ROOT, SOLUTIONS, stale

FILES = ("README.md", "CONTRIBUTING.md", "pyproject.toml", "Makefile", "environment.yml")
FOLDERS = ("lecture_lib", "notebooks", "exercises", "examples", "tests")
SKIP_NAMES = ("__pycache__", ".ipynb_checkpoints", ".pytest_cache", "*.pyc", "*.egg-info")
# The grader's tests need the solutions (and show how to defeat a naive grader).
SKIP_TESTS = ("test_grading*.py", "tamper_routes.py")


def _ignore(private: list[Path]):
    def ignore(folder: str, names: list[str]) -> set[str]:
        here = Path(folder).resolve()
        skip = set(shutil.ignore_patterns(*SKIP_NAMES)(folder, names))
        if here == (ROOT / "tests").resolve():
            skip |= set(shutil.ignore_patterns(*SKIP_TESTS)(folder, names))
            skip |= {n for n in names if (here / n).is_dir() and n != "exercises"}
        skip |= {n for n in names if any((here / n).resolve() == p for p in private)}
        return skip
    return ignore


def release(target: str | Path, private: list[str | Path] = ()) -> list[str]:
    """Write the student release into ``target``; return the released paths (relative)."""
    target = Path(target)
    if target.exists() and any(target.iterdir()):
        raise ValueError(f"{target} exists and is not empty")
    if (bad := stale()):
        raise ValueError(f"stale exercise stubs {bad}: run `python -m lecture_lib.exercises`")
    private = [Path(p).resolve() for p in private]
    target.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, target / name)
    for name in FOLDERS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, target / name, ignore=_ignore(private))
    released = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    _check(target, released)
    return released


def _check(target: Path, released: list[str]) -> None:
    """No solution file, and no released file that holds a solution's worked lines."""
    answers = [s.read_text() for s in SOLUTIONS.glob("ex*.py")]
    for rel in released:
        if rel.startswith("solutions"):
            raise RuntimeError(f"{rel}: a solution reached the release")
        if rel.endswith(".py") and (target / rel).read_text(errors="replace") in answers:
            raise RuntimeError(f"{rel} is a copy of a solution")
    assert (target / "exercises").is_dir() and EXERCISES.is_dir()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lecture_lib.release",
                                     description="Write the folder students get.")
    parser.add_argument("dir", help="where to write it (new or empty)")
    parser.add_argument("--private", action="append", default=[], metavar="DIR",
                        help="a folder never to release (e.g. your --extra-tests)")
    args = parser.parse_args(argv)
    released = release(args.dir, args.private)
    print(f"wrote {len(released)} files to {args.dir} (no solutions/, no grader tests)")
    return 0
