"""The welcome notebook's self-study answers, computed with the course's memory model, and the
course's reading times."""
from __future__ import annotations

import json
from pathlib import Path

from ..costmodel import GB, model_state_bytes
from . import fmt

GPT3_PARAMS = 175e9          # Brown et al. 2020
SEVEN_B = 7e9                # a 7-billion-parameter model


def q1_seven_billion() -> list[str]:
    """Mixed-precision Adam: 16 bytes per parameter; how many 80 GB devices just for the state."""
    state = model_state_bytes(SEVEN_B)                 # 2 + 2 + 12 bytes per parameter
    devices = -(-state // (80 * GB))
    return [fmt(state / 1e9, "GB"), f"{devices:.0f} devices"]


def q2_gpt3_layout() -> list[str]:
    """Model state per GPU when tensor x pipeline GPUs share one copy, for two layouts."""
    state = model_state_bytes(GPT3_PARAMS)
    return [fmt(state / (8 * 16) / 1e9, "GB"), fmt(state / (8 * 8) / 1e9, "GB")]


def q3_global_batch() -> list[str]:
    """global batch = micro-batch x accumulation steps x dp; in tokens at 2048 per sequence."""
    micro, accumulation, dp, seq = 4, 8, 16, 2048
    sequences = micro * accumulation * dp
    return [f"{sequences} sequences", f"{sequences * seq:,} tokens"]


def q4_bf16_state() -> list[str]:
    """The 7B model's state in plain fp32 (4 + 4 + 4 + 4 bytes) and all in bf16, no master copy
    (2 + 2 + 2 + 2 bytes); how many 80 GB devices the bf16 state needs."""
    fp32 = model_state_bytes(SEVEN_B, optimizer_bytes_per_param=8, param_bytes=4, grad_bytes=4)
    bf16 = model_state_bytes(SEVEN_B, optimizer_bytes_per_param=4, param_bytes=2, grad_bytes=2)
    assert fp32 == model_state_bytes(SEVEN_B), "fp32 and mixed precision: 16 bytes either way"
    devices = -(-bf16 // (80 * GB))
    return [fmt(fp32 / 1e9, "GB"), fmt(bf16 / 1e9, "GB"), f"{devices:.0f} device"]


ANSWERS = {"Q1": q1_seven_billion, "Q2": q2_gpt3_layout, "Q3": q3_global_batch,
           "Q4": q4_bf16_state}


# ----------------------------------------------------------------------------
# Reading times: the README's "reading" column and notebook 00's course map
# (tests/test_study_welcome.py keeps both equal to reading_table)
# ----------------------------------------------------------------------------

WORDS_PER_MINUTE = 200       # prose (Brysbaert 2019 measured 238 for silent reading)
CODE_LINES_PER_MINUTE = 20
MINUTES_PER_FIGURE = 1.0


def _figures(code: str) -> int:
    """Figures a code cell shows: its ``check_figure(`` or ``plt.show()`` calls, whichever is more
    (a cell usually makes both calls for one figure; an explorer's snapshot is checked too)."""
    return max(code.count("check_figure("), code.count("plt.show()"))


def reading_minutes(notebook: Path) -> float:
    """Minutes to read ``notebook`` with care, from its source alone.

    Prose at WORDS_PER_MINUTE (folded answers included), code at CODE_LINES_PER_MINUTE and
    MINUTES_PER_FIGURE per figure the code shows.
    """
    cells = json.loads(notebook.read_text())["cells"]
    text = {kind: ["".join(c["source"]) for c in cells if c["cell_type"] == kind]
            for kind in ("markdown", "code")}
    words = sum(len(t.split()) for t in text["markdown"])
    code = sum(len(t.splitlines()) for t in text["code"])
    figures = sum(_figures(t) for t in text["code"])
    return words / WORDS_PER_MINUTE + code / CODE_LINES_PER_MINUTE + figures * MINUTES_PER_FIGURE


def reading_table(folder: Path) -> dict[str, int]:
    """Each notebook of ``folder`` (by stem) and its reading time in whole minutes."""
    return {path.stem: round(reading_minutes(path))
            for path in sorted(Path(folder).glob("[0-9A]*.ipynb"))}
