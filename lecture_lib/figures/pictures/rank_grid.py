"""The rank grid mapped onto nodes, with its three kinds of groups.

A job of ``dp x pp x tp`` (x ``cp``) ranks numbers its ranks row-major with the last
dimension fastest (:mod:`lecture_lib.mesh`), and a cluster fills its nodes in rank order:
node ``n`` holds ranks ``n g .. n g + g - 1`` for nodes of ``g`` GPUs. So the fastest
dimension's groups are runs of consecutive ranks and, when they hold at most ``g`` ranks,
lie inside one node and talk over NVLink; the slower dimensions' groups stride across
nodes and talk over the network. Megatron-LM puts tensor parallelism fastest for that
reason: its all-reduces sit on the critical path of every layer, pipeline sends are few
and data-parallel all-reduces overlap with backward (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", section 3.3).

:func:`rank_grid_layout` computes the picture from :func:`lecture_lib.mesh.grid_groups`
(which ranks share a group along each dimension, which node each rank is on, which groups
cross a node boundary); :func:`draw_rank_grid` draws it: one row of boxes per node, a
shaded band around each tensor-parallel group, lines joining the members of each
pipeline-parallel (and context-parallel) group, and one lettered badge per data-parallel group
on each of its members.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.legend_handler import HandlerBase
from matplotlib.lines import Line2D

from ...mesh import check_grid, grid_coordinates, grid_groups

STYLE = {"tp": ("#4C72B0", "-"), "cp": ("#8172B3", "-."), "pp": ("#DD8452", "-"),
         "dp": ("#55A868", "--")}
"""Colour and line style of each dimension's groups."""
OFFSET = {"pp": -0.22, "dp": 0.22, "cp": 0.0}
"""Where, across a box, a dimension's connecting line runs (so that lines do not overlap)."""


def rank_grid_layout(dims: dict[str, int], gpus_per_node: int) -> dict:
    """What :func:`draw_rank_grid` draws, as data.

    ``{"world": n, "node": {rank: node}, "coords": {rank: {dim: i}}, "labels": {rank: text},
    "groups": {dim: [[ranks], ...]}, "crosses_nodes": {dim: [bool per group]}}``.
    """
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) \
            or gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be a whole number >= 1, not {gpus_per_node!r}")
    world = math.prod(dims.values()) if dims else 0
    check_grid(world, dims)
    if world % gpus_per_node:
        raise ValueError(f"{world} ranks do not fill whole nodes of {gpus_per_node} GPUs")
    unknown = set(dims) - set(STYLE)
    if unknown:
        raise ValueError(f"unknown grid dimensions {sorted(unknown)}; known: {sorted(STYLE)}")
    node = {r: r // gpus_per_node for r in range(world)}
    coords = {r: grid_coordinates(r, dims) for r in range(world)}
    groups = {d: grid_groups(dims, d) for d in dims}
    return {"world": world, "gpus_per_node": gpus_per_node, "dims": dict(dims), "node": node,
            "coords": coords,
            "labels": {r: _label(r, coords[r]) for r in range(world)},
            "groups": groups,
            "crosses_nodes": {d: [len({node[r] for r in g}) > 1 for g in gs]
                              for d, gs in groups.items()}}


def _label(rank: int, coords: dict[str, int]) -> str:
    """'rank 5\ndp0 pp1 tp1' (coordinates on two lines when there are four)."""
    parts = [f"{d}{i}" for d, i in coords.items()]
    rows = [parts] if len(parts) <= 3 else [parts[:2], parts[2:]]
    return "\n".join([f"rank {rank}"] + [" ".join(row) for row in rows])


def _position(rank: int, g: int) -> tuple[float, float]:
    """Lower-left corner of a rank's box: node rows top to bottom, GPUs left to right."""
    return (rank % g) * 1.3, -(rank // g) * 1.6


def _lane(groups: list[list[int]], i: int, g: int) -> float:
    """A sideways shift for group ``i``'s line, so that two groups of one dimension whose lines
    would run over the same column between the same nodes (dp=2 x pp=2: dp groups {0, 8} and
    {4, 12}) are drawn side by side instead of merging into one."""
    col, span = groups[i][0] % g, (groups[i][0] // g, groups[i][-1] // g)
    earlier = [grp for grp in groups[:i] if grp[0] % g == col
               and grp[0] // g < span[1] and span[0] < grp[-1] // g]
    return 0.1 * len(earlier)


def _route(pts: list[tuple[float, float]], shift: float, lane: float):
    """The line through a group's boxes. Between boxes in one column more than a node apart it
    leaves the first box below, runs down the gap right of the column and enters the second
    from above, so that it never passes behind another rank's box."""
    xs, ys = [], []
    for k, (x, y) in enumerate(pts):
        cx, cy = x + 0.5 + shift, y + 0.45
        if k:
            px, py = pts[k - 1]
            if px == x and py - y > 1.7:           # skips at least one node row in this column
                gap, out = x + 1.08 + 1.4 * lane, 0.12 + lane
                xs += [xs[-1], gap, gap, cx]
                ys += [py - out, py - out, y + 0.9 + out, y + 0.9 + out]
        xs.append(cx)
        ys.append(cy)
    return xs, ys


def _draw_dp_badges(ax, groups: list[list[int]], g: int) -> None:
    """One lettered, coloured badge on each member of a dp group, the same on all its members
    (lines joining them would cross every other group's)."""
    cmap = plt.get_cmap("tab10")
    for i, group in enumerate(groups):
        if len(group) < 2:
            continue
        for r in group:
            x, y = _position(r, g)
            ax.plot(x + 0.86, y + 0.86, marker="o", ms=13, color=cmap(i % 10), ls="none",
                    zorder=5, label="dp group:\nsame letter" if i == 0 and r == group[0] else None)
            ax.text(x + 0.86, y + 0.86, chr(ord("A") + i % 26), ha="center", va="center",
                    fontsize=8, color="white", fontweight="bold", zorder=6)


class _BadgesHandler(HandlerBase):
    """The dp badges' legend handle: three lettered discs in three colours, as on the grid."""

    def create_artists(self, legend, orig_handle, xdescent, ydescent, width, height, fontsize,
                       trans):
        cmap, artists = plt.get_cmap("tab10"), []
        for k in range(3):
            x, y = -xdescent + width * (k + 0.5) / 3, -ydescent + height / 2
            artists += [Line2D([x], [y], marker="o", ms=10, color=cmap(k), ls="none",
                               transform=trans),
                        Line2D([x], [y], marker=f"$\\mathregular{{{chr(ord('A') + k)}}}$", ms=6,
                               color="white", ls="none", transform=trans)]
        return artists


def draw_rank_grid(dims: dict[str, int], gpus_per_node: int, ax=None):
    """Draw the grid on its nodes; returns ``(fig, layout)`` (:func:`rank_grid_layout`)."""
    layout = rank_grid_layout(dims, gpus_per_node)
    g, world = gpus_per_node, layout["world"]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 * g + 2.8, 1.45 * world // g + 0.6))
    for n in range(world // g):
        ax.add_patch(plt.Rectangle((-0.2, -n * 1.6 - 0.25), g * 1.3 - 0.1, 1.4, fc="none",
                                   ec="0.55", lw=1, ls=":"))
        ax.text(-0.35, -n * 1.6 + 0.45, f"node {n}", ha="right", va="center", fontsize=9)
    for group in layout["groups"].get("tp", []):
        xs = [_position(r, g) for r in group]
        if len(group) > 1 and len({layout["node"][r] for r in group}) == 1:
            x0, y0 = min(x for x, _ in xs), xs[0][1]
            ax.add_patch(plt.Rectangle((x0 - 0.1, y0 - 0.12), max(x for x, _ in xs) - x0 + 1.2,
                                       1.14, fc=STYLE["tp"][0], alpha=0.18, ec="none"))
    for r in range(world):
        x, y = _position(r, g)
        ax.add_patch(plt.Rectangle((x, y), 1.0, 0.9, fc="white", ec="k", lw=0.8,
                                   zorder=3))
        ax.text(x + 0.5, y + 0.45, layout["labels"][r], ha="center", va="center", fontsize=8,
                zorder=4)
    _draw_dp_badges(ax, layout["groups"].get("dp", []), g)
    for d in ("cp", "pp", "tp"):
        color, style = STYLE[d]
        for i, group in enumerate(layout["groups"].get(d, [])):
            if len(group) < 2 or (d == "tp" and not layout["crosses_nodes"]["tp"][i]):
                continue                   # a tp group inside a node is its shaded band
            lane = _lane(layout["groups"][d], i, g)
            base = OFFSET.get(d, 0.0)          # lanes move away from the box's centre
            shift = base + math.copysign(lane, base or 1.0)
            xs, ys = _route([_position(r, g) for r in group], shift, lane)
            ax.plot(xs, ys, color=color, ls=style, lw=1.8, zorder=2,   # behind the boxes
                    label=f"{d} group" if i == 0 else None)
    if "tp" in dims and dims["tp"] > 1:
        ax.plot([], [], color=STYLE["tp"][0], lw=8, alpha=0.25, label="tp group (in a node)")
    ax.set_xlim(-1.3, g * 1.3)
    ax.set_ylim(-(world // g - 1) * 1.6 - 0.4, 1.3)
    ax.set_aspect("equal")
    ax.axis("off")
    shape = " x ".join(f"{d}={s}" for d, s in dims.items())
    ax.set_title(f"{shape} on nodes of {g} GPUs (rank order: last dimension fastest)",
                 fontsize=10)
    badges = {h: _BadgesHandler() for h, lab in zip(*ax.get_legend_handles_labels())
              if lab.startswith("dp group")}
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, handlelength=3.5,
              handler_map=badges)
    return ax.figure, layout


__all__ = ["draw_rank_grid", "rank_grid_layout"]
