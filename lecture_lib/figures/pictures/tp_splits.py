"""Megatron's tensor-parallel splits of attention and the MLP, with the shapes on every block.

Shoeybi et al. 2019 ("Megatron-LM", arXiv:1909.08053, section 3, Fig. 3) split the MLP's
first weight by columns, ``W1 [h, 4h/tp]``, so GELU runs on whole columns, and its second by
rows, ``W2 [4h/tp, h]``, so each rank's GELU output is exactly the input its rows need; the
partial products are summed. Attention is split by heads the same way: the fused
``W_QKV [h, 3h/tp]`` gives each rank ``a/tp`` whole heads, the output projection
``W_O [h/tp, h]`` is row-parallel. Only the two edges of each block talk: **f** (identity
forward, all-reduce backward) before it and **g** (all-reduce forward, identity backward)
after it. The shard shapes come from
:func:`lecture_lib.tensor_parallel.layers.weight_shard_shape`, the rule the layers split by.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...tensor_parallel.layers import check_divisible, weight_shard_shape
from ..plots import COLORS

KIND_COLORS = {"tensor": "#FFFFFF", "weight": "#DCE6F2", "local": "#E8F0E0",
               "comm": COLORS["comm"]}
F_TEXT = "f\nfwd: identity\nbwd: all-reduce"
G_TEXT = "g\nfwd: all-reduce\nbwd: identity"


def _shape(*dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def split_blocks(batch: int, seq: int, hidden: int, heads: int, tp: int) -> dict:
    """``{"attention": [...], "mlp": [...]}``: each block ``(kind, name, shape text)`` in order.

    Kinds: ``"tensor"`` (an activation, whole on every rank), ``"comm"`` (f or g),
    ``"weight"`` (this rank's shard) and ``"local"`` (computed on this rank's shard only).
    """
    for name, v in (("batch", batch), ("seq", seq), ("hidden", hidden), ("heads", heads),
                    ("tp", tp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
    check_divisible("attention", "heads", heads, tp)
    check_divisible("attention", "hidden", hidden, heads)
    b, s, h = batch, seq, hidden
    w1 = weight_shard_shape(h, 4 * h, tp, "column")
    w2 = weight_shard_shape(4 * h, h, tp, "row")
    qkv = weight_shard_shape(h, 3 * h, tp, "column")
    out = weight_shard_shape(h, h, tp, "row")
    x = ("tensor", "X", _shape(b, s, h))
    attention = [x, ("comm", F_TEXT, ""),
                 ("weight", "W_QKV\ncolumn shard\n[h, 3h/tp]", _shape(*qkv)),
                 ("local", f"q, k, v\n{heads // tp} heads", _shape(b, s, qkv[1])),
                 ("local", f"attention\n{heads // tp} of {heads} heads", _shape(b, s, out[0])),
                 ("weight", "W_O\nrow shard\n[h/tp, h]", _shape(*out)),
                 ("local", "partial\nsum", _shape(b, s, h)),
                 ("comm", G_TEXT, ""), ("tensor", "Y", _shape(b, s, h))]
    mlp = [x, ("comm", F_TEXT, ""),
           ("weight", "W1\ncolumn shard\n[h, 4h/tp]", _shape(*w1)),
           ("local", "GELU(X W1_i)", _shape(b, s, w1[1])),
           ("weight", "W2\nrow shard\n[4h/tp, h]", _shape(*w2)),
           ("local", "partial\nsum", _shape(b, s, h)),
           ("comm", G_TEXT, ""), ("tensor", "Z", _shape(b, s, h))]
    return {"attention": attention, "mlp": mlp}


def _draw_row(ax, blocks, tp: int, title: str) -> None:
    n = len(blocks)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(-1.0, 1.2)
    ax.axis("off")
    for i, (kind, name, shape) in enumerate(blocks):
        stacked = kind in ("weight", "local")
        for layer in range(min(tp, 3) - 1 if stacked else 0, -1, -1):   # shadows: other ranks
            ax.add_patch(plt.Rectangle((i - 0.42 + 0.06 * layer, -0.45 + 0.08 * layer), 0.84,
                                       0.9, facecolor=KIND_COLORS[kind], edgecolor="0.3",
                                       alpha=1.0 if layer == 0 else 0.6))
        ax.text(i, 0.15 if shape else 0.0, name, ha="center", va="center", fontsize=8,
                wrap=True)
        if shape:
            ax.text(i, -0.25, shape, ha="center", va="center", fontsize=9, family="monospace")
        if i:
            ax.annotate("", (i - 0.43, 0), (i - 0.57, 0),
                        arrowprops={"arrowstyle": "->", "color": "0.3"})
    ax.text((n - 1) / 2, -0.85, f"shaded blocks: rank 0 of tp = {tp} (shadows: the other ranks, "
            "each its own shard)", ha="center", fontsize=8, color="0.35")
    ax.set_title(title, fontsize=10)


def draw_tp_splits(batch: int = 1, seq: int = 2048, hidden: int = 64, heads: int = 8,
                   tp: int = 4):
    """Both splits, attention above the MLP; returns ``(fig, split_blocks(...))``."""
    blocks = split_blocks(batch, seq, hidden, heads, tp)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 4.6))
    _draw_row(top, blocks["attention"], tp, f"self-attention split by heads, tp = {tp} "
              f"(b = {batch}, s = {seq}, h = {hidden}, a = {heads})")
    _draw_row(bottom, blocks["mlp"], tp, f"MLP: W1 by columns, W2 by rows, tp = {tp} "
              "(Shoeybi et al. 2019, Fig. 3)")
    fig.tight_layout()
    return fig, blocks


__all__ = ["draw_tp_splits", "split_blocks"]
