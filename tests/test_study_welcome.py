"""The README's "reading" column is what notebook 00's ``reading_times`` computes from the
notebooks' sources."""
from __future__ import annotations

import re
from pathlib import Path

from lecture_lib.study.welcome import reading_table

ROOT = Path(__file__).resolve().parents[1]


def readme_reading() -> dict[str, str]:
    """The README map's notebook stem -> its "reading" cell."""
    lines = (ROOT / "README.md").read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| notebook |"))
    columns = [c.strip() for c in lines[header].strip("|").split("|")]
    col = columns.index("reading")
    rows = {}
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[re.sub(r"`", "", cells[0])] = cells[col]
    return rows


def test_readme_reading_column_is_recomputed():
    table = reading_table(ROOT / "notebooks")
    computed = {stem: f"{minutes} min" for stem, minutes in table.items()}
    assert readme_reading() == computed, (
        "README's reading column is stale; put these in it:\n"
        + "\n".join(f"{stem}: {value}" for stem, value in computed.items()))
