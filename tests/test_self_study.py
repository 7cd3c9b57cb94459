"""Each notebook ends with 3-5 self-study questions whose numeric answers the library computes.

See lecture_lib/study: the folded answer of a hand calculation must contain every string
its ANSWERS function returns, and no figure that is not one of them.
"""
import json
import re
from pathlib import Path

import pytest

from lecture_lib import study

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
HEADING = "## Check your understanding"
QUESTION = re.compile(r"\*\*(Q\d+)\.\*\*")
DETAILS = re.compile(r"<details>\s*<summary>.*?</summary>(.*?)</details>", re.S)
# a number with a unit, as tests/test_notebook_prose.py reads figures in prose
FIGURE = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*\s?(?:%|[KMGTP]i?B\b|[KMGTP]?FLOP/s|GB/s|ms\b|us\b"
                    r"|µs|s\b|x(?!\w)|B\b)")
MATH_AND_CODE = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$|`[^`\n]*`", re.S)


def questions(path: Path) -> dict[str, str]:
    """{'Q1': the question's text with its answer} from the notebook's last study cell."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]
    text = next(("".join(c["source"]) for c in reversed(cells)
                 if "".join(c["source"]).lstrip().startswith(HEADING)), None)
    assert text is not None, f"{path.name}: no markdown cell starting with {HEADING!r}"
    parts = QUESTION.split(text)[1:]
    return dict(zip(parts[0::2], parts[1::2]))


def answer(block: str) -> str:
    found = DETAILS.findall(block)
    assert len(found) == 1, "each question has exactly one <details><summary>..</summary> answer"
    return found[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_three_to_five_questions_each_with_a_folded_answer(path):
    qs = questions(path)
    assert 3 <= len(qs) <= 5, f"{path.name}: {len(qs)} questions (want 3-5)"
    assert list(qs) == [f"Q{i}" for i in range(1, len(qs) + 1)], list(qs)
    for label, block in qs.items():
        assert answer(block).strip(), f"{path.name} {label}: empty answer"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_computed_answers_appear_and_no_other_figure_is_typed(path):
    qs, computed = questions(path), study.answers(path.name)
    assert computed, f"{path.name}: no hand calculation in {study.module_name(path.name)}"
    for label, block in qs.items():
        text = answer(block)
        expected = list(computed[label]()) if label in computed else []
        for s in expected:
            assert s in text, f"{path.name} {label}: the answer lacks {s!r} (computed)"
        prose = MATH_AND_CODE.sub(" ", text)
        typed = [m.group(0) for m in FIGURE.finditer(prose)
                 if not any(m.group(0) in s for s in expected)]
        assert not typed, (f"{path.name} {label}: figures typed in the answer but not computed "
                           f"by {study.module_name(path.name)}.ANSWERS[{label!r}]: {typed}")


def test_answers_registered_only_for_existing_questions():
    for path in NOTEBOOKS:
        labels = set(questions(path)) if study.answers(path.name) else set()
        assert set(study.answers(path.name)) <= labels, path.name
