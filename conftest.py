"""Keep what nbval executes: each notebook, with its outputs, for the book.

``pytest --nbval-lax notebooks`` runs every code cell of a notebook in one kernel and checks
that none fails; it keeps no outputs. This plugin keeps them: after a notebook's last cell it
writes the notebook, every cell's outputs and execution count filled in, to
``$LECTURE_EXECUTED_DIR`` (default ``build/executed``) under its own name, with the SHA-256 of
the source it ran and, when a cell failed, which one (``metadata.lecture_lib``). ``make book``
builds the course's web book from these copies, so CI executes each notebook once.
"""
import hashlib
import os
from pathlib import Path

import nbformat
import pytest

EXECUTED = "LECTURE_EXECUTED_DIR"


def _is_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and hasattr(item.parent, "nb")


def executed_dir(config) -> Path:
    return Path(os.environ.get(EXECUTED) or Path(config.rootpath) / "build" / "executed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if not _is_cell(item) or call.when != "call":
        return
    counter = getattr(item.parent, "_executed_count", 0) + 1
    item.parent._executed_count = counter
    item.cell.outputs = list(getattr(item, "test_outputs", None) or [])
    item.cell.execution_count = counter
    if outcome.get_result().failed and not hasattr(item.parent, "_failed_cell"):
        item.parent._failed_cell = item.parent.nb.cells.index(item.cell)


def pytest_runtest_teardown(item, nextitem):
    if not _is_cell(item) or (nextitem is not None and nextitem.parent is item.parent):
        return
    nb, source = item.parent.nb, Path(item.parent.path)
    nb.metadata["lecture_lib"] = {
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "failed_cell": getattr(item.parent, "_failed_cell", None)}
    out = executed_dir(item.config)
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out / source.name))
