"""Which model chunk lives on which rank under interleaved 1F1B.

Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters using Megatron-LM", section 2.2.2) cuts the model into
``pp * v`` contiguous *virtual stages* instead of ``pp``; rank ``r`` holds ``v``
of them, virtual stages ``r, r + pp, r + 2pp, ...``, so a micro-batch's forward
visits ranks 0, 1, ..., pp-1, then 0, 1, ... again, ``v`` times round. Each hop
costs 1/v of a stage, which is why the ramp (and the bubble) shrinks by ``v``,
at the price of about ``v`` times more messages.

:func:`chunk_assignment` reads the assignment from the library's own schedule
(:meth:`lecture_lib.pipeline.Schedule.stage`, the chunks that appear in each rank's
actions) and layer split (:func:`lecture_lib.pipeline.layer_ranges`, what
:func:`~lecture_lib.pipeline.split_gpt` cuts); :func:`draw_interleaved` draws it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ...pipeline import Schedule, layer_ranges
from ..plots import COLORS, plot_timeline

RANK_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
               "#8C8C8C")


def chunk_assignment(schedule: Schedule, n_layers: int, layers=None) -> dict:
    """``{rank: [(chunk, virtual_stage, range_of_layers), ...]}`` as the executor places them:
    rank r's chunk c is virtual stage ``schedule.stage(r, c)``; only chunks the rank's actions
    use are listed (all v of them in a complete schedule)."""
    ranges = layer_ranges(n_layers, schedule.num_stages, schedule.chunks, layers)
    out = {}
    for rank, acts in enumerate(schedule.actions):
        used = sorted({a.chunk for a in acts})
        out[rank] = [(c, schedule.stage(rank, c), ranges[schedule.stage(rank, c)]) for c in used]
    return out


def _layers(r: range) -> str:
    return f"layer {r.start}" if len(r) == 1 else f"layers {r.start}-{r.stop - 1}"


def draw_interleaved(schedule: Schedule, n_layers: int, layers=None):
    """Top: the model's layers in order, each virtual stage coloured by the rank holding it,
    with the path of one micro-batch's forward. Bottom: each rank's chunks. Returns
    ``(figure, assignment)`` (:func:`chunk_assignment`)."""
    assignment = chunk_assignment(schedule, n_layers, layers)
    p, parts = schedule.num_stages, schedule.num_virtual_stages
    owner = {stage: (rank, c, r) for rank, held in assignment.items() for c, stage, r in held}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(7.0, 1.3 * parts), 2.2 + 0.7 * p),
                                      gridspec_kw={"height_ratios": [1.2, p]})
    for stage in range(parts):
        rank, c, r = owner[stage]
        top.barh(0, len(r), left=r.start, height=0.8, color=RANK_COLORS[rank % 8],
                 edgecolor="white")
        top.text(r.start + len(r) / 2, 0, f"stage {stage}\nrank {rank}", ha="center",
                 va="center", fontsize=8, color="white")
        if stage:
            top.annotate("", (r.start + 0.1, -0.55), (r.start - 0.1, -0.55),
                         arrowprops={"arrowstyle": "->", "color": COLORS["F"]})
    top.set(xlim=(0, n_layers), ylim=(0.6, -0.8), yticks=[],
            title=f"the model's {n_layers} layers in {parts} virtual stages (pp={p} ranks, "
                  f"v={schedule.chunks} chunks each); arrows: a forward's path")
    top.set_xlabel("layer index")
    for rank, held in assignment.items():
        for c, _stage, r in held:
            bottom.barh(rank, len(r), left=r.start, height=0.7, color=RANK_COLORS[rank % 8])
            bottom.text(r.start + len(r) / 2, rank, f"chunk {c}\n{_layers(r)}", ha="center",
                        va="center", fontsize=8, color="white")
    bottom.set(xlim=(0, n_layers), yticks=range(p), yticklabels=[f"rank {r}" for r in range(p)],
               xlabel="layer index", title="what each rank holds: virtual stages r, r + pp, ...")
    bottom.invert_yaxis()
    for ax in (top, bottom):
        ax.grid(False)
    fig.tight_layout()
    return fig, assignment


# Interleaved 1F1B's timeline: each kind in two clearly different shades, one per chunk,
# chunk 0 light (black digits), chunk 1 dark (white digits).
CHUNK_COLORS = {("F", 0): "#6F9FE0", ("F", 1): "#1B2E52", ("B", 0): "#F39A4E",
                ("B", 1): "#8B3E12", ("W", 0): "#7CCB8A", ("W", 1): "#245C34"}


def draw_interleaved_timeline(ax, timeline: dict, title: str | None = None,
                              fontsize: float = 9) -> list[dict]:
    """``plots.plot_timeline`` of an interleaved schedule, recoloured so the two chunks read
    apart (:data:`CHUNK_COLORS`), every box labelled with its micro-batch, and a
    legend outside the data. Returns plot_timeline's list of drawn spans (colours updated)."""
    first = len(ax.patches)
    drawn = plot_timeline(ax, timeline, title, unit="s", labels=False, legend=False)
    used = {}
    for patch, box in zip(ax.patches[first:], drawn):
        key = (box["kind"], box["chunk"] or 0)
        box["color"] = CHUNK_COLORS.get(key, box["color"])
        patch.set_facecolor(box["color"])
        used[key] = box["color"]
        if box["microbatch"] is not None:
            box["text"] = str(box["microbatch"])
            narrow = box["width"] < 0.75 * max(b["width"] for b in drawn)   # a half-width box
            ax.text(box["start"] + box["width"] / 2, box["y"], box["text"], ha="center",
                    va="center", fontsize=max(8, fontsize - 1) if narrow else fontsize,
                    color="white" if key[1] else "black")
    handles = [Patch(color=c, label=f"{k} chunk {ch}") for (k, ch), c in sorted(
        used.items(), key=lambda kv: ("FBW".find(kv[0][0]), kv[0][1]))]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return drawn
