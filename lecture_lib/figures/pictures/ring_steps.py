"""The ring step by step: which K/V block each rank holds, and what it computes with it.

A picture of :func:`lecture_lib.context_parallel.ring.ring_schedule` (the same
schedule the ring runs): one row per step, one column per rank; a cell names the
rank whose K/V block is held and the chunk pairs attended (one a line), greyed out when the
causal mask skips every pair (the block is only passed on).
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...context_parallel.layout import rank_chunks
from ...context_parallel.ring import ring_schedule


def cell_labels(cp: int, layout: str = "zigzag", causal: bool = True) -> list[list[str]]:
    """``labels[step][rank]``: the text of each cell of :func:`draw_ring_steps`."""
    labels = []
    for row in ring_schedule(cp, layout, causal):
        texts = []
        for rank, cell in enumerate(row):
            mine, theirs = rank_chunks(rank, cp, layout), rank_chunks(cell["source"], cp, layout)
            pairs = "\n".join(f"q{mine[i]}k{theirs[j]}{'*' if kind == 'diag' else ''}"
                             for i, j, kind in cell["pairs"]) or "skipped"
            texts.append(f"K/V of rank {cell['source']}\n{pairs}")
        labels.append(texts)
    return labels


def draw_ring_steps(cp: int = 4, layout: str = "zigzag", causal: bool = True, ax=None):
    """Draw the ring's steps on ``ax`` (or a new figure); returns the figure."""
    if ax is None:
        _, ax = plt.subplots(figsize=(1.9 * cp + 1, 0.9 * cp + 1))
    colors = plt.get_cmap("tab10")
    schedule, labels = ring_schedule(cp, layout, causal), cell_labels(cp, layout, causal)
    for step, row in enumerate(schedule):
        for rank, cell in enumerate(row):
            face = colors(cell["source"] % 10) if cell["pairs"] else (0.85, 0.85, 0.85)
            ax.add_patch(plt.Rectangle((rank, step), 0.96, 0.92, facecolor=face, alpha=0.55))
            ax.text(rank + 0.48, step + 0.46, labels[step][rank], ha="center", va="center",
                    fontsize=10)
    ax.set_xlim(0, cp)
    ax.set_ylim(cp, 0)
    chunks = [", ".join(map(str, rank_chunks(r, cp, layout))) for r in range(cp)]
    word = "chunks" if layout == "zigzag" else "chunk"
    ax.set_xticks([r + 0.48 for r in range(cp)],
                  [f"rank {r}\n{word} {c}" for r, c in enumerate(chunks)])
    ax.set_yticks([s + 0.46 for s in range(cp)], [f"step {s}" for s in range(cp)])
    ax.grid(False)
    n_chunks = 2 * cp if layout == "zigzag" else cp
    ax.set_title(f"ring attention, cp={cp}, {layout} layout{', causal' if causal else ''}: "
                 f"the sequence in {n_chunks} chunks (0-{n_chunks - 1})\n"
                 "qAkB = query chunk A against key chunk B"
                 + (" (* masked diagonal)" if causal else ""), fontsize=10)
    return ax.figure
