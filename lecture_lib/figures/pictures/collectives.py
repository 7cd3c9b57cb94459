"""What each collective does to the data: every rank's buffer before and after, as blocks.

A buffer is cut into ``p`` blocks (chunks). Before a collective, block ``j`` of rank ``i``
holds that rank's own data for chunk ``j``, written ``{(i, j)}``. After it, each block holds
a *set of contributions* ``(rank, chunk)``: one element means a copy of that rank's chunk, more
than one means their sum. The six collectives of MPI and NCCL (MPI Forum, *MPI: A
Message-Passing Interface Standard* 4.0, chapter 6; NVIDIA, NCCL User Guide, "Collective
Operations"), on ``p`` ranks with root ``root``:

* broadcast: every rank ends with the root's buffer;
* reduce: the root ends with the element-wise sum; the other ranks keep their input;
* all-reduce: every rank ends with the sum (= reduce-scatter, then all-gather);
* reduce-scatter: rank ``i`` ends with block ``i`` of the sum, and only that block;
* all-gather: rank ``i`` starts with one block (its own, in slot ``i``); every rank ends
  with all of them;
* all-to-all: block ``j`` of rank ``i`` goes to rank ``j``, slot ``i`` (a transpose).

:func:`contents` computes the before and after sets (pure, no process), :func:`draw` draws
them as coloured blocks: a copy of rank ``i``'s data in rank ``i``'s colour, a sum in grey
with the chunk it sums, an empty slot blank.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

KINDS = ("broadcast", "reduce", "all_reduce", "reduce_scatter", "all_gather", "all_to_all")
RANK_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
               "#8C8C8C")
SUM_COLOR = "#3A3A3A"

Buffers = list[list[frozenset]]          # buffers[rank][block] = {(rank, chunk), ...}


def _own(p: int) -> Buffers:
    return [[frozenset({(i, j)}) for j in range(p)] for i in range(p)]


def _summed(p: int, chunk: int) -> frozenset:
    return frozenset((r, chunk) for r in range(p))


def contents(kind: str, p: int, root: int = 0) -> tuple[Buffers, Buffers]:
    """``(before, after)``: for each rank, each block's set of ``(rank, chunk)`` contributions.

    An empty set is a slot the rank does not hold (reduce-scatter's output is one block;
    all-gather's input is one block).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
    if not isinstance(p, int) or p < 1:
        raise ValueError(f"p must be a positive int, not {p!r}")
    if not 0 <= root < p:
        raise ValueError(f"root must be in [0, {p}), not {root}")
    empty = frozenset()
    before = _own(p)
    if kind == "all_gather":
        before = [[frozenset({(i, i)}) if j == i else empty for j in range(p)] for i in range(p)]
        after = [[frozenset({(j, j)}) for j in range(p)] for _ in range(p)]
    elif kind == "broadcast":
        after = [[frozenset({(root, j)}) for j in range(p)] for _ in range(p)]
    elif kind == "reduce":
        after = [[_summed(p, j) for j in range(p)] if i == root else list(before[i])
                 for i in range(p)]
    elif kind == "all_reduce":
        after = [[_summed(p, j) for j in range(p)] for _ in range(p)]
    elif kind == "reduce_scatter":
        after = [[_summed(p, j) if j == i else empty for j in range(p)] for i in range(p)]
    else:                                                  # all_to_all
        after = [[frozenset({(j, i)}) for j in range(p)] for i in range(p)]
    return before, after


def label(block: frozenset, p: int) -> str:
    """What is written on a block: ``'2:1'`` (rank 2's chunk 1), ``'Σ1'`` (chunk 1 summed over
    all ranks), ``'0+2:1'`` (a partial sum), ``''`` (empty)."""
    if not block:
        return ""
    ranks = sorted(r for r, _ in block)
    chunk = next(iter(block))[1]
    if len(ranks) == 1:
        return f"{ranks[0]}:{chunk}"
    return f"Σ{chunk}" if len(ranks) == p else "+".join(map(str, ranks)) + f":{chunk}"


def _color(block: frozenset) -> str:
    if not block:
        return "white"
    return RANK_COLORS[next(iter(block))[0] % len(RANK_COLORS)] if len(block) == 1 else SUM_COLOR


def draw_buffers(ax, buffers: Buffers, title: str, origin=(0.0, 0.0)) -> list[str]:
    """One panel on ``ax`` with its top-left corner at ``origin`` (data units, y down): rows =
    ranks, columns = blocks, one unit square per block. Returns the labels written, row by row."""
    x0, y0 = origin
    p, written = len(buffers), []
    for i, row in enumerate(buffers):
        ax.text(x0 - 0.15, y0 + i + 0.5, f"rank {i}", ha="right", va="center", fontsize=8)
        for j, block in enumerate(row):
            ax.add_patch(Rectangle((x0 + j, y0 + i), 1, 1, facecolor=_color(block),
                                   edgecolor="0.6", lw=0.8))
            text = label(block, p)
            written.append(text)
            if text:
                ax.text(x0 + j + 0.5, y0 + i + 0.5, text, ha="center", va="center", fontsize=8,
                        color="white", gid="block")
    ax.text(x0 - 0.15, y0 + p + 0.1, "chunk", ha="right", va="top", fontsize=8)
    for j in range(len(buffers[0])):
        ax.text(x0 + j + 0.5, y0 + p + 0.1, str(j), ha="center", va="top", fontsize=8)
    ax.text(x0 + len(buffers[0]) / 2, y0 - 0.15, title, ha="center", va="bottom", fontsize=9)
    return written


PANEL_W, PANEL_H = 6.0, 6.2               # a p = 4 panel and its margins, in data units


def panel_origin(n: int, after: bool, p: int) -> tuple[float, float]:
    """Top-left corner of collective ``n``'s before (or after) panel: two collectives a row."""
    scale = p / 4
    col = 2 * (n % 2) + (1 if after else 0)
    return (col * PANEL_W * scale + 1.5, (n // 2) * PANEL_H * scale + 1.0)


def draw(kinds=KINDS, p: int = 4, root: int = 0):
    """Before and after of each collective, side by side, on one axes (cheap to draw);
    returns ``(fig, {kind: (before, after)})``, the sets drawn. ``'i:j'`` = rank i's chunk j;
    ``'Σj'`` = chunk j summed over all ranks."""
    kinds = list(kinds)
    data = {kind: contents(kind, p, root) for kind in kinds}
    rows = (len(kinds) + 1) // 2
    fig, ax = plt.subplots(figsize=(11, 2.75 * rows))
    for n, kind in enumerate(kinds):
        name = kind.replace("_", "-") + (f" (root {root})" if kind in ("broadcast", "reduce")
                                         else "")
        for after, when in ((False, "before"), (True, "after")):
            draw_buffers(ax, data[kind][int(after)], f"{name}: {when}", panel_origin(n, after, p))
    ax.set_xlim(0, 4 * PANEL_W * p / 4)
    ax.set_ylim(rows * PANEL_H * p / 4, 0)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.suptitle(f"what each collective does to {p} ranks' buffers ('i:j' = rank i's chunk j, "
                 "'Σj' = chunk j summed over all ranks, blank = not held)", fontsize=9)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.94, bottom=0.01)
    return fig, data


__all__ = ["KINDS", "contents", "draw", "draw_buffers", "label", "panel_origin"]
