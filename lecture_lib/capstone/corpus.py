"""The capstone's corpus: the running interpreter's own standard library source.

Every machine that runs this course has it, so nothing is downloaded: the ``*.py`` files
under ``sysconfig.get_paths()["stdlib"]`` are tens of MB of real, structured text (code,
docstrings, comments). We keep the library itself and leave out what is not "the
library": installed packages (``site-packages``, ``dist-packages``), the regression test
suites (any folder named ``test`` or ``tests``, e.g. ``test/`` and ``lib2to3/tests``, over
half the bytes and full of generated or deliberately odd text), ``idlelib`` and
``turtledemo`` (applications, not library), and empty files (``__init__.py`` stubs give no
tokens). What remains is ~12 MB in ~700 files on CPython 3.11.

The split into train and validation is **by file** (as one would split a code corpus by
repository: no file's text is in both), decided by a seeded hash of the file's path
relative to the stdlib root, so a file's side does not depend on which other files exist
or on ``max_bytes``. ``max_bytes`` takes a deterministic slice (a seeded order, filled
greedily up to the budget, about ``val_fraction`` of it validation) so that CI can train
on a small, always-identical part of the corpus.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib",
                           "turtledemo", "__pycache__"})


@dataclass(frozen=True)
class Corpus:
    """A split of the corpus: sorted train and validation files and their sizes."""

    root: Path
    train: tuple[Path, ...]
    val: tuple[Path, ...]
    train_bytes: int
    val_bytes: int
    fingerprint: str  # sha256 of the chosen files (relative paths and sizes) and split

    @property
    def files(self) -> tuple[Path, ...]:
        return self.train + self.val

    def summary(self) -> dict:
        return {"root": str(self.root), "train_files": len(self.train),
                "val_files": len(self.val), "train_bytes": self.train_bytes,
                "val_bytes": self.val_bytes}


def stdlib_root() -> Path:
    """The running interpreter's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: str | Path | None = None) -> list[Path]:
    """Every non-empty ``*.py`` file under `root` outside EXCLUDED_DIRS, sorted."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise ValueError(f"corpus root {root} is not a folder")
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS]  # prune: never walk them
        for name in names:
            path = Path(folder, name)
            if name.endswith(".py") and path.is_file() and path.stat().st_size > 0:
                files.append(path)
    return sorted(files)


def _unit(seed: int, key: str, salt: str) -> float:
    """A number in [0, 1) fixed by (seed, key): a seeded hash, not Python's salted hash()."""
    digest = hashlib.sha256(f"{seed}:{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def _take(files: list[Path], sizes: dict[Path, int], budget: float | None) -> list[Path]:
    """Greedy fill in the given order: keep each file that still fits into `budget`."""
    if budget is None:
        return files
    taken, used = [], 0
    for path in files:
        if used + sizes[path] <= budget:
            taken.append(path)
            used += sizes[path]
    return taken


def split_corpus(max_bytes: int | None = None, val_fraction: float = 0.05, seed: int = 0,
                 root: str | Path | None = None) -> Corpus:
    """Split the corpus into train/validation by file; optionally a `max_bytes` slice.

    A file is validation when its seeded hash is below `val_fraction`. With `max_bytes`,
    files are visited in a seeded order and kept while they fit: train up to
    ``(1 - val_fraction) * max_bytes`` and validation up to ``val_fraction * max_bytes``.
    """
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)):
        raise TypeError(f"max_bytes must be an int or None, got {type(max_bytes).__name__}")
    if max_bytes is not None and max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    root = Path(root) if root is not None else stdlib_root()
    files = corpus_files(root)
    sizes = {p: p.stat().st_size for p in files}
    rel = {p: p.relative_to(root).as_posix() for p in files}
    order = sorted(files, key=lambda p: _unit(seed, rel[p], "order"))
    is_val = {p: _unit(seed, rel[p], "split") < val_fraction for p in files}
    budget = None if max_bytes is None else max_bytes * (1.0 - val_fraction)
    train = sorted(_take([p for p in order if not is_val[p]], sizes, budget))
    budget = None if max_bytes is None else max_bytes * val_fraction
    val = sorted(_take([p for p in order if is_val[p]], sizes, budget))
    if not train or not val:
        raise ValueError(f"max_bytes={max_bytes} leaves an empty split "
                         f"({len(train)} train, {len(val)} validation files): raise it")
    digest = hashlib.sha256(f"{seed}:{val_fraction}".encode())
    for side, paths in (("train", train), ("val", val)):
        for p in paths:
            digest.update(f"{side}:{rel[p]}:{sizes[p]}\n".encode())
    return Corpus(root, tuple(train), tuple(val), sum(sizes[p] for p in train),
                  sum(sizes[p] for p in val), digest.hexdigest())


def read_text(path: str | Path) -> str:
    """A corpus file's text (the stdlib is UTF-8, PEP 3120)."""
    return Path(path).read_text(encoding="utf-8")
