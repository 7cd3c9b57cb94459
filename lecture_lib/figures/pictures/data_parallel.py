"""Data parallelism in one picture: replicas, shards of the batch, buckets all-reduced in backward.

Li et al. 2020 ("PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
VLDB, section 3): every rank holds the same parameters (a *replica*) and takes a contiguous
shard of the global batch (:func:`lecture_lib.models.shard`). Backward produces the gradients
from the last layer to the first, and DDP groups them into buckets in that order
(:func:`lecture_lib.data_parallel.ddp.make_buckets`). A bucket's all-reduce starts once its
last gradient is ready and the bucket before it has been all-reduced (every rank issues them
in the same order), so the all-reduces run while backward goes on; only the last bucket's is
left when backward ends. Then every rank takes the same optimizer step on the same averaged
gradients, and the replicas stay equal.

:func:`layout` computes what the picture shows (which sequences each rank takes, which layers
each bucket holds, when each piece of the step runs, in units of one layer's backward) from
those two library functions; :func:`draw` draws it: each rank's shard and replica on the left,
its step on the right, in the course colours.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

from ...data_parallel.ddp import make_buckets
from ...models import shard
from ..plots import COLORS, plot_timeline

LAYER_BYTES = 2**20                     # one layer's gradient: 1 MiB (its size only matters)
DATA_COLOR = "#8C8C8C"                  # the batch's sequences: grey, apart from the kinds' colours


def layout(p: int = 4, batch: int = 8, layers: int = 6, layers_per_bucket: int = 2,
           forward: float = 0.5, backward: float = 1.0, latency: float = 0.3,
           comm_per_layer: float = 0.5, optimizer: float = 1.5) -> dict:
    """What the picture shows, in units of one layer's backward (``backward``).

    ``shards[r]``: the global-batch indices rank r takes; ``buckets``: the layers (1 = first)
    of each bucket, in launch order; ``steps[r]``: rank r's step as ``(kind, start, end,
    text)`` spans (kinds forward, backward, comm, optimizer); ``exposed``: how long the
    optimizer waits after backward for the last all-reduce.
    """
    if p < 1 or batch % p or layers < 1 or layers_per_bucket < 1:
        raise ValueError(f"need p >= 1 dividing batch, layers >= 1 and layers_per_bucket >= 1, "
                         f"not p={p}, batch={batch}, layers={layers}, "
                         f"layers_per_bucket={layers_per_bucket}")
    shards = [shard((torch.arange(batch),), r, p)[0].tolist() for r in range(p)]
    grads = [torch.empty(LAYER_BYTES, dtype=torch.uint8, device="meta") for _ in range(layers)]
    number = {id(g): i + 1 for i, g in enumerate(grads)}
    buckets = [[number[id(g)] for g in b]
               for b in make_buckets(grads, layers_per_bucket * LAYER_BYTES / 2**20)]
    spans = [("forward", 0.0, layers * forward, "forward")]
    done = {}                                          # layer -> when its gradient is ready
    t = layers * forward
    for layer in range(layers, 0, -1):                 # backward: last layer first
        spans.append(("backward", t, t + backward, f"L{layer}"))
        t += backward
        done[layer] = t
    backward_end, comm_end = t, 0.0
    for i, bucket in enumerate(buckets):
        start = max(max(done[layer] for layer in bucket), comm_end)
        comm_end = start + latency + comm_per_layer * len(bucket)
        spans.append(("comm", start, comm_end, f"bucket {i + 1}"))
    spans.append(("optimizer", max(backward_end, comm_end),
                  max(backward_end, comm_end) + optimizer, "step"))
    return {"shards": shards, "buckets": buckets, "steps": {r: list(spans) for r in range(p)},
            "backward_end": backward_end, "exposed": max(comm_end - backward_end, 0.0)}


def _replicas(ax, shards: list, layers: int) -> None:
    """Left panel: each rank's shard (numbered squares in its colour) and its replica."""
    for r, mine in enumerate(shards):
        for j, index in enumerate(mine):
            ax.add_patch(Rectangle((j, r - 0.35), 0.9, 0.7, color=DATA_COLOR))
            ax.text(j + 0.45, r, str(index), ha="center", va="center", fontsize=8, color="white")
        x0 = len(mine) + 1.2
        ax.annotate("", (x0 - 0.1, r), (len(mine) - 0.05, r),
                    arrowprops={"arrowstyle": "->", "color": "0.4"})
        for layer in range(layers):
            ax.add_patch(Rectangle((x0 + 0.62 * layer, r - 0.3), 0.55, 0.6,
                                   facecolor=COLORS["compute"], alpha=0.35,
                                   edgecolor=COLORS["compute"]))
    width = len(shards[0]) + 1.2 + 0.62 * layers
    ax.set_xlim(-0.2, width + 0.1)
    ax.set_ylim(len(shards) - 0.5, -0.5)
    ax.set_yticks(range(len(shards)), [f"rank {r}" for r in range(len(shards))])
    ax.set_xticks([len(shards[0]) / 2 - 0.05, len(shards[0]) + 1.2 + 0.31 * layers],
                  ["its shard\nof the batch", f"the same {layers} layers\n(a replica)"],
                  fontsize=8)
    ax.tick_params(length=0)
    ax.grid(False)
    for side in ax.spines.values():
        side.set_visible(False)


def draw(p: int = 4, batch: int = 8, layers: int = 6, layers_per_bucket: int = 2):
    """The picture; returns ``(fig, data)`` with ``data`` = :func:`layout`'s dict and
    ``"drawn"``, the timeline's spans as :func:`~lecture_lib.figures.plots.plot_timeline`
    drew them."""
    data = layout(p, batch, layers, layers_per_bucket)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.75 * p + 1.6),
                                      gridspec_kw={"width_ratios": [1, 2.6]})
    _replicas(left, data["shards"], layers)
    left.set_title(f"a global batch of {batch} sequences: each rank takes\n"
                   f"{batch // p} of them and holds the same parameters", fontsize=9)
    data["drawn"] = plot_timeline(right, data["steps"], unit="s", labels=True,
                                  legend_outside=True)
    right.tick_params(axis="y", which="major", labelleft=False)    # the ranks: named on the left
    if data["exposed"] > 0:                                       # every rank waits alike
        for wait in (b for b in data["drawn"] if b["kind"] == "optimizer"):
            right.text(data["backward_end"] + data["exposed"] / 2, wait["y"], "wait",
                       ha="center", va="center", fontsize=8, color="0.3")
    right.set_xlabel("time (in units of one layer's backward)")
    right.set_title(f"backward from L{layers} to L1: each bucket of {layers_per_bucket} layers "
                    "is all-reduced\nas soon as it is full, while backward goes on", fontsize=9)
    fig.text(0.99, 0.01, "a picture of the idea: times in units of one layer's backward, not "
             "measured", ha="right", fontsize=8, color="0.4")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig, data


__all__ = ["DATA_COLOR", "LAYER_BYTES", "draw", "layout"]
