"""The reading times a student sees, in the README's map ("reading") and in notebook 00's course
map ("minutes"), are what ``lecture_lib.study.welcome.reading_table`` computes from the notebooks'
sources."""
from __future__ import annotations

import json
import re
from pathlib import Path

from lecture_lib.study.welcome import reading_table

ROOT = Path(__file__).resolve().parents[1]


def table_column(text: str, column: str) -> dict[str, str]:
    """The first markdown table of ``text`` with a ``column`` header: notebook -> that cell."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines)
                  if line.startswith("| notebook |") and f"| {column} |" in line)
    columns = [c.strip() for c in lines[header].strip("|").split("|")]
    col = columns.index(column)
    rows = {}
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[re.sub(r"`", "", cells[0])] = cells[col]
    return rows


def test_readme_reading_column_is_recomputed():
    computed = {stem: f"{minutes} min"
                for stem, minutes in reading_table(ROOT / "notebooks").items()}
    shown = table_column((ROOT / "README.md").read_text(), "reading")
    assert shown == computed, (
        "README's reading column is stale; put these in it:\n"
        + "\n".join(f"{stem}: {value}" for stem, value in computed.items()))


def test_notebook_00_course_map_minutes_are_recomputed():
    cells = json.loads((ROOT / "notebooks" / "00_welcome.ipynb").read_text())["cells"]
    course_map = next("".join(c["source"]) for c in cells
                      if c["cell_type"] == "markdown" and "| minutes |" in "".join(c["source"]))
    shown = table_column(course_map, "minutes")
    computed = {stem.split("_")[0]: str(minutes)
                for stem, minutes in reading_table(ROOT / "notebooks").items()
                if not stem.startswith("00")}
    assert shown == computed, (
        "notebook 00's course map has stale minutes; put these in it:\n"
        + "\n".join(f"{key}: {value}" for key, value in computed.items()))
