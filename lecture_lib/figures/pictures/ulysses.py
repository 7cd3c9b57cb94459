"""Which rank holds which head and token of q, before and after DeepSpeed-Ulysses' all-to-all.

Ulysses (Jacobs et al. 2023, section 3) starts with each of the ``cp`` ranks holding its own
tokens for every head, and one all-to-all regroups q (and k, v) so that each rank holds every
token of ``heads / cp`` heads; attention then runs head by head, and a second all-to-all sends
the output back. :func:`holdings_rank` runs the library's own
:func:`~lecture_lib.context_parallel.ulysses.seq_to_heads` on the ranks, on a tensor whose
every value names its head and its token, and returns what this rank held before and holds
after; :func:`owner_grids` turns every rank's answer into two grids (rows: heads, columns:
tokens, value: the rank that holds it) and :func:`draw_ulysses` draws them.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.distributed as dist
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from ...context_parallel.layout import positions
from ...context_parallel.ulysses import check_ulysses, seq_to_heads


def holdings_rank(heads: int, tokens: int, layout: str = "contiguous") -> dict[str, list[int]]:
    """Rank function: the values this rank holds before and after ``seq_to_heads``, each value
    ``head * tokens + token`` (so it names the head and the global token it belongs to)."""
    rank, cp = dist.get_rank(), dist.get_world_size()
    check_ulysses(heads, cp)
    mine = positions(rank, cp, tokens, layout)                      # this rank's tokens
    x = (torch.arange(heads)[:, None] * tokens + mine[None, :]).double()[None, :, :, None]
    after = seq_to_heads(x)                                         # (1, heads / cp, tokens, 1)
    return {"before": x.flatten().long().tolist(), "after": after.flatten().long().tolist()}


def owner_grids(results: list[dict], heads: int, tokens: int) -> dict[str, np.ndarray]:
    """``{"before", "after"}``: a heads x tokens grid of the rank holding each value, from
    every rank's :func:`holdings_rank`; a ValueError if a value is held twice or not at all."""
    grids = {phase: np.full((heads, tokens), -1) for phase in ("before", "after")}
    for rank, held in enumerate(results):
        for phase, grid in grids.items():
            for value in held[phase]:
                head, token = divmod(value, tokens)
                if grid[head, token] != -1:
                    raise ValueError(f"{phase}: head {head}, token {token} is held by ranks "
                                     f"{grid[head, token]} and {rank}")
                grid[head, token] = rank
    for phase, grid in grids.items():
        if (grid < 0).any():
            raise ValueError(f"{phase}: {int((grid < 0).sum())} values are held by no rank")
    return grids


def draw_ulysses(grids: dict[str, np.ndarray], cp: int):
    """Both grids side by side, coloured by the rank that holds each value; returns the figure."""
    colors = [plt.get_cmap("tab10")(r % 10) for r in range(cp)]
    heads, tokens = grids["before"].shape
    fig, axes = plt.subplots(1, 2, figsize=(10, 2.9))
    titles = {"before": "before: each rank holds its tokens, every head",
              "after": f"after the all-to-all: each rank holds every token of {heads // cp} heads"}
    for ax, (phase, grid) in zip(axes, grids.items()):
        ax.imshow(grid, cmap=ListedColormap(colors), vmin=0, vmax=cp - 1, aspect="auto",
                  interpolation="nearest")
        ax.set_title(titles[phase], fontsize=9)
        ax.set_xlabel("token")
        ax.set_ylabel("head")
        ax.set_xticks(range(0, tokens, max(1, tokens // 4)))
        ax.set_yticks(range(heads))
        ax.grid(False)
    axes[1].legend([Patch(color=c) for c in colors], [f"rank {r}" for r in range(cp)],
                   loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    fig.suptitle(f"Ulysses on cp = {cp} ranks: q's {heads} heads x {tokens} tokens, "
                 "coloured by the rank that holds them", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    return fig


__all__ = ["draw_ulysses", "holdings_rank", "owner_grids"]
