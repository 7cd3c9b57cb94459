r"""Sequence parallelism: the regions of one transformer block and the collectives between them.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198, section 4.2.2 and Fig. 5): under tensor parallelism the layer norms, dropouts
and residual additions are computed whole on every rank, so their activations are stored
``tp`` times. Sequence parallelism splits those regions along the sequence, ``[s/tp, b, h]``
per rank. Entering a tensor-parallel region (attention, MLP) the sequence is all-gathered,
:math:`\mathrm{AG}` (all-gather forward, reduce-scatter backward); leaving it, the partial sums
are reduce-scattered along the sequence, :math:`\mathrm{RS}` (reduce-scatter forward, all-gather
backward). The names are the course's (notebook 04), after what each does forward: Korthikanti
et al. 2022 call them ``g`` and ``g-bar``, and their ``t`` is the course's ``tp``; the course
keeps ``f`` and ``g`` for Megatron's all-reduce pair (Shoeybi et al. 2019).
An all-reduce is a reduce-scatter followed by an all-gather, so the bytes are those of plain
tensor parallelism. The operators are the library's
(:mod:`lecture_lib.tensor_parallel.comm`); shapes follow the paper's ``[s, b, h]`` order (the
library keeps batch first, ``[b, s, h]``, and splits dimension 1).
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...tensor_parallel.comm import (
    AllGatherFromSequenceParallelRegion,
    ReduceScatterToSequenceParallelRegion,
)
from ...tensor_parallel.layers import check_divisible
from ..plots import COLORS

REGION_COLORS = {"sequence parallel": "#E8F0E0", "tensor parallel": "#DCE6F2",
                 "all_gather": COLORS["comm"], "reduce_scatter": COLORS["comm"]}
AG = ("all_gather", "$\\mathrm{AG}$\nfwd: all-gather\nbwd: reduce-scatter",
      AllGatherFromSequenceParallelRegion.__name__)
RS = ("reduce_scatter", "$\\mathrm{RS}$\nfwd: reduce-scatter\nbwd: all-gather",
      ReduceScatterToSequenceParallelRegion.__name__)


def block_regions(seq: int, batch: int, hidden: int, tp: int) -> list[dict]:
    """The steps of one block in order: ``{"kind", "name", "shape_in", "dims_in"}``.

    ``kind`` is a region (``"sequence parallel"``, ``"tensor parallel"``) or a collective
    (``"all_gather"``, ``"reduce_scatter"``, with ``"function"`` the library's operator);
    ``shape_in`` is the tensor on the arrow into the step, symbolic, ``dims_in`` in numbers.
    """
    for name, v in (("seq", seq), ("batch", batch), ("hidden", hidden), ("tp", tp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
    check_divisible("sequence parallelism", "seq", seq, tp)
    split = ("[s/tp, b, h]", (seq // tp, batch, hidden))
    whole = ("[s, b, h]", (seq, batch, hidden))
    partial = ("[s, b, h] partial", (seq, batch, hidden))      # one partial sum per rank
    steps = []
    for tp_name in ("self-attention\n(heads split)", "MLP\n(W1 cols, W2 rows)"):
        steps += [("sequence parallel", "LayerNorm", split), (*AG[:2], split, AG[2]),
                  ("tensor parallel", tp_name, whole), (*RS[:2], partial, RS[2]),
                  ("sequence parallel", "dropout\n+ residual", split)]
    out = []
    for kind, name, (shape, dims), *function in steps:
        out.append({"kind": kind, "name": name, "shape_in": shape, "dims_in": dims,
                    **({"function": function[0]} if function else {})})
    return out


def draw_sequence_parallel(seq: int = 2048, batch: int = 1, hidden: int = 64, tp: int = 4):
    """One block under tensor + sequence parallelism; returns ``(fig, block_regions(...))``."""
    steps = block_regions(seq, batch, hidden, tp)
    half = len(steps) // 2
    fig, ax = plt.subplots(figsize=(12, 4.4))
    ax.set_xlim(-0.9, half - 0.2)
    ax.set_ylim(-3.2, 0.9)
    ax.axis("off")
    for i, step in enumerate(steps):
        x, y = i % half, -1.8 * (i // half)
        ax.add_patch(plt.Rectangle((x - 0.36, y - 0.4), 0.72, 0.8, edgecolor="0.3",
                                   facecolor=REGION_COLORS[step["kind"]]))
        ax.text(x, y, step["name"], ha="center", va="center", fontsize=8)
        ax.text(x - 0.5, y + 0.62, f"{step['shape_in']}\n{list(step['dims_in'])}",
                ha="center", va="center", fontsize=8, family="monospace")
        ax.annotate("", (x - 0.37, y), (x - 0.63, y),
                    arrowprops={"arrowstyle": "->", "color": "0.3"})
    ax.annotate("", (half - 0.38, -1.8), (half - 0.64, -1.8),
                arrowprops={"arrowstyle": "->", "color": "0.3"})
    ax.text(half - 0.5, -1.18, f"[s/tp, b, h]\n{list(steps[-1]['dims_in'])}", ha="center",
            va="center", fontsize=8, family="monospace")
    for x, label in ((0.0, "sequence-parallel region"), (2.0, "tensor-parallel region")):
        ax.text(x, -2.65, label, ha="center", fontsize=8, color="0.3",
                bbox={"facecolor": REGION_COLORS["sequence parallel" if x == 0 else
                                                  "tensor parallel"], "edgecolor": "0.5"})
    ax.text(3.0, -2.65, "s = sequence, b = micro-batch, h = hidden, tp = tensor-parallel size; "
            "red: collectives",
            ha="left", fontsize=8, color="0.3")
    ax.set_title(f"one transformer block, tensor + sequence parallelism, tp = {tp} "
                 "(Korthikanti et al. 2022, Fig. 5); row 2 continues row 1", fontsize=10)
    fig.tight_layout()
    return fig, steps


__all__ = ["block_regions", "draw_sequence_parallel"]
