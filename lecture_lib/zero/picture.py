"""Which rank holds what, moment by moment: FSDP's gather / compute / free, drawn.

Between uses a unit is *sharded*: rank r holds only its 1/N of the unit's
weights. An all-gather *in flight* (prefetched, or just launched) is turning
the shards into the *full* weights, which every rank then holds while the
unit computes and until it is freed (Zhao et al. 2023, "PyTorch FSDP",
figure 2). :func:`shard_states` replays a model's ``events`` (what
:class:`~lecture_lib.zero.fsdp.FullyShardedModel` records when asked) into
the state of every unit after each event; :func:`plot_shard_states` draws it.
"""
from __future__ import annotations

import matplotlib.patches as mpatches
import numpy as np

STATES = ("sharded", "in flight", "full", "computing")
STATE_COLORS = {"sharded": "#dddddd", "in flight": "#f2b134", "full": "#6aa9d8",
                "computing": "#1f5f9e"}
_AFTER = {"gather": "in flight", "full": "full", "compute": "computing", "done": "full",
          "reduce_scatter": "full", "free": "sharded"}


def shard_states(events, units) -> list[tuple[str, dict[str, str]]]:
    """``[(label, {unit: state})]`` after each event that changes a state."""
    now = {u: "sharded" for u in units}
    out = []
    for what, unit, phase, *_ in events:
        state = _AFTER.get(what)
        if state is None or unit not in now or now[unit] == state and what != "compute":
            continue
        now[unit] = state
        out.append((f"{what} {unit} ({phase})", dict(now)))
    return out


def plot_shard_states(ax, states, units, world_size: int, title: str | None = None):
    """One row per unit, one column per moment; the colour says what each rank holds."""
    grid = np.array([[STATES.index(s[u]) for _, s in states] for u in units])
    colors = [STATE_COLORS[s] for s in STATES]
    for i in range(len(units)):
        for j in range(grid.shape[1]):
            ax.add_patch(mpatches.Rectangle((j, i), 1, 1, color=colors[grid[i, j]], lw=0.3,
                                            ec="white"))
    ax.set_xlim(0, grid.shape[1])
    ax.set_ylim(len(units), 0)
    ax.set_yticks(np.arange(len(units)) + 0.5, units)
    ax.set_xlabel("moment (one column per gather / compute / free event, in order)")
    ax.set_ylabel("unit")
    labels = {"sharded": f"sharded: rank r holds its 1/{world_size}",
              "in flight": "all-gather in flight", "full": f"full: all {world_size} ranks",
              "computing": "computing (full)"}
    handles = [mpatches.Patch(color=STATE_COLORS[s], label=labels[s]) for s in STATES]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    return ax
