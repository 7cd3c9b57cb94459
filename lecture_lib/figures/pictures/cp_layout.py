"""Which rank computes which part of causal attention, under the contiguous and zig-zag layouts.

Context parallelism gives each of the ``cp`` ranks the queries of ``s / cp`` tokens, and a
query attends to the keys at or before it. Contiguous chunks leave rank 0 a corner of the
causal triangle and the last rank its widest rows; the zig-zag layout (Brandon et al. 2023,
"Striped Attention"; Megatron-Core and Llama 3, Dubey et al. 2024, section 3.3.2) gives rank
``r`` chunks ``r`` and ``2cp - 1 - r``, one short row band and one long one, so every rank
gets the same area. The token-to-rank map is :func:`lecture_lib.context_parallel.layout.positions`,
the one the ring runs with.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from ...context_parallel.layout import check_layout, positions


def causal_owners(seq_len: int, cp: int, layout: str) -> np.ndarray:
    """``owners[q, k]``: the rank that computes query ``q`` against key ``k``; -1 if masked."""
    check_layout(seq_len, cp, layout)
    owner = np.empty(seq_len, dtype=int)
    for rank in range(cp):
        owner[positions(rank, cp, seq_len, layout).numpy()] = rank
    q, k = np.indices((seq_len, seq_len))
    return np.where(k <= q, owner[:, None].repeat(seq_len, 1), -1)


def work_per_rank(owners: np.ndarray, cp: int) -> list[int]:
    """Query-key pairs each rank computes (the area it owns in the causal triangle)."""
    return [int((owners == rank).sum()) for rank in range(cp)]


def draw_cp_layouts(seq_len: int = 32, cp: int = 4):
    """Both layouts side by side; returns ``(fig, {layout: owners})``."""
    grids = {layout: causal_owners(seq_len, cp, layout) for layout in ("contiguous", "zigzag")}
    colors = ["#F2F2F2"] + [plt.get_cmap("tab10")(r % 10) for r in range(cp)]
    cmap = ListedColormap(colors)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    for ax, (layout, owners) in zip(axes, grids.items()):
        ax.imshow(owners + 1, cmap=cmap, vmin=0, vmax=cp, interpolation="nearest")
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        work = work_per_rank(owners, cp)
        ax.set_title(f"{layout}: query-key pairs per rank\n{work}", fontsize=9)
        for rank in range(cp):
            rows = positions(rank, cp, seq_len, layout).numpy()
            for band in np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1):
                ax.text(seq_len + 0.1, band.mean(), f"rank {rank}", va="center", fontsize=8,
                        color=colors[rank + 1])
        ax.set_xlim(-0.5, seq_len + 5)
        ax.set_xticks(range(0, seq_len, max(1, seq_len // 4)))
    fig.suptitle(f"causal attention on cp = {cp} ranks, {seq_len} tokens: who computes which "
                 "pairs (grey: masked)", fontsize=10)
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    return fig, grids


__all__ = ["causal_owners", "draw_cp_layouts", "work_per_rank"]
