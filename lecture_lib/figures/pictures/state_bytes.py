"""Bytes of model state per parameter under Adam, in each precision the memory model knows.

Rajbhandari et al. 2020 (ZeRO, section 3.1) count mixed-precision Adam as 2 + 2 + K bytes per
parameter: 16-bit weights and gradients, and K = 12 bytes of optimizer state, an fp32 master
copy of the weights (4) and Adam's two fp32 moments (8; Kingma & Ba 2015). Plain fp32 Adam keeps
4 + 4 + 8. Under PyTorch's autocast the weights and gradients stay fp32 and only the matmuls
run in bf16, so it keeps fp32's 4 + 4 + 8. Every precision holds 16 bytes.

:func:`segments` reads the split from :data:`lecture_lib.costmodel.memory.PRECISIONS`;
:func:`draw_state_bytes` draws one stacked bar per precision.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...costmodel.memory import PRECISIONS
from ..plots import COLORS, stamp

ADAM_MOMENT_BYTES = 8          # Adam's first and second moments, fp32 each
_COLORS = {"weights": COLORS["compute"], "gradients": COLORS["backward"],
           "master": "#B9AED6", "Adam's": COLORS["optimizer"]}
LABELS = {"mixed (bf16/fp16 + fp32 master)": "mixed precision\n(ZeRO paper)", "fp32": "fp32",
          "autocast (bf16 compute, fp32 weights)": "PyTorch autocast\n(bf16 compute)"}


def segments(precision: str) -> list[tuple[str, int]]:
    """(what, bytes per parameter) for Adam under ``precision``, a key of ``PRECISIONS``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, not {precision!r}")
    p, g, k = PRECISIONS[precision]
    width = {2: "16-bit", 4: "fp32"}
    parts = [(f"weights, {width[p]}", p), (f"gradients, {width[g]}", g)]
    if k > ADAM_MOMENT_BYTES:
        parts.append(("master weights, fp32", k - ADAM_MOMENT_BYTES))
    return parts + [("Adam's two moments, fp32", ADAM_MOMENT_BYTES)]


def draw_state_bytes(precisions=tuple(PRECISIONS)):
    """One stacked bar per precision; returns (figure, {precision: total bytes})."""
    fig, ax = plt.subplots(figsize=(9, 2.9))
    totals = {}
    for row, precision in enumerate(precisions):
        left = 0
        for what, b in segments(precision):
            color = _COLORS[what.split(",")[0].split()[0]]
            ax.barh(row, b, left=left, color=color, edgecolor="white")
            ax.text(left + b / 2, row, what.replace(", ", "\n") + f": {b}", ha="center",
                    va="center", fontsize=8, color="white")
            left += b
        ax.text(left + 0.2, row, f"{left} bytes", va="center", fontsize=9)
        totals[precision] = left
    ax.set_yticks(range(len(precisions)), [LABELS.get(p, p) for p in precisions], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, 19)
    ax.set_xlabel("bytes of model state per parameter (Adam)")
    ax.set_title("Adam keeps 16 bytes per parameter in every precision", fontsize=10)
    ax.set_xticks(range(0, 17, 2))
    stamp(fig, text="modelled: bytes by formula (Rajbhandari et al. 2020, section 3.1)")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig, totals
