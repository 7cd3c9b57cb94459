"""Committed notebooks carry no outputs, and each asserts what it claims."""
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean_and_asserts(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    dirty = [i for i, c in enumerate(cells) if c.get("outputs") or c.get("execution_count")]
    assert not dirty, f"code cells {dirty} carry outputs: run `make clean-notebooks`"
    asserting = [c for c in cells if "assert " in "".join(c["source"])]
    assert len(asserting) >= 3, "a notebook asserts each key result in a cell of its own"
