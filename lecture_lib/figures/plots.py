"""One look for every figure of the course, and the label that says who measured it.

Every measured figure carries :func:`machine_label` (CPU model, cores, GPUs,
backend and ranks) via :func:`stamp`, so a plot copied out of a notebook
still says where its numbers came from, and which time it shows: real time
on this machine, or the emulated time of a GPU cluster (``emulated=``, see
:mod:`lecture_lib.emulate`): "emulated H100 + NVLink, measured from the real
code on <machine>". :func:`plot_timeline` draws per-rank
spans (compute, communication, pipeline actions) as a Gantt chart, computation and
communication on lanes of their own so that their overlap shows.
"""
from __future__ import annotations

import os
import platform
import re
from typing import NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import to_rgb

from .. import emulate

# One colour per kind of work, used by every timeline in the course.
COLORS = {
    "compute": "#4C72B0", "forward": "#4C72B0", "F": "#4C72B0",
    "backward": "#DD8452", "B": "#DD8452", "W": "#55A868",
    "comm": "#C44E52", "communication": "#C44E52", "optimizer": "#8172B3",
    "idle": "#DDDDDD", "bubble": "#DDDDDD",
}
_ACTION = re.compile(r"([FBW])(\d+)(?:\.(\d+))?")   # str(Action): F3, B2.1
# The kinds of span plot_timeline draws on a row's communication lane (the rest: compute).
COMM_KINDS = ("comm", "communication")
_LANE, _LANE_HEIGHT = 0.21, 0.4     # a split row: compute lane centred 0.21 above, comm below


def use_style() -> None:
    plt.rcParams.update({
        "figure.figsize": (7, 4), "figure.dpi": 100, "axes.grid": True,
        "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
        "font.size": 10, "legend.frameon": False,
    })


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_label(backend: str | None = None, world_size: int | None = None,
                  emulated=None, kind: str = "measured") -> str:
    """E.g. 'measured on Intel Xeon, 2 cores, no GPU; gloo, 4 ranks (one process each)'.

    ``emulated`` (a preset name or an ``emulate.Cluster``): 'emulated H100 +
    NVLink, measured from the real code on Intel Xeon, ...'. ``kind`` names what the
    figure shows of the real run when it is not a time: ``"counted"`` (bytes, calls, FLOPs)
    or ``"computed"`` (losses, values): 'counted on Intel Xeon, ...'.
    """
    if kind not in ("measured", "counted", "computed"):
        raise ValueError(f"kind is 'measured', 'counted' or 'computed', not {kind!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu = f"{gpus} x {torch.cuda.get_device_name(0)}" if gpus else "no GPU"
    text = f"on {cpu_name()}, {os.cpu_count()} cores, {gpu}"
    if emulated is None:
        text = f"{kind} {text}"
    else:
        text = f"{emulate.label(emulated)}, measured from the real code {text}"
    if backend:
        text += f"; {backend}"
        if world_size:
            text += f", {world_size} ranks (one process each)"
    return text


def stamp(fig, backend: str | None = None, world_size: int | None = None,
          text: str | None = None, emulated=None, kind: str = "measured") -> None:
    """Write who measured the figure, and in which time, in its bottom-right corner.

    ``emulated``: the preset the figure's times were emulated on (None: real time);
    ``kind``: "counted" or "computed" for a figure of bytes or values (:func:`machine_label`).
    """
    fig.text(0.99, 0.005, text or machine_label(backend, world_size, emulated, kind), ha="right",
             va="bottom", fontsize=8, color="0.4")


def plain_log_ticks(axis, lo: float | None = None, hi: float | None = None,
                    mantissas=(1, 2, 5), base: float = 10, outer: bool = False) -> list[float]:
    """Label a log-scaled ``axis`` (``ax.xaxis`` / ``ax.yaxis``) with plain numbers.

    Ticks go at ``m x base^k`` for ``m`` in ``mantissas`` ("50", "0.3", "0.125"; not
    matplotlib's "5x10^1" or "3x10^-1"), with no minor ticks, from ``lo`` to ``hi`` (the
    axis's view limits by default). ``outer=True`` also takes the nearest tick below ``lo``
    and above ``hi`` and sets the view limits to them, so both ends are labelled. Returns
    the ticks.
    """
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: PLC0415

    view = sorted(axis.get_view_interval())
    lo, hi = view[0] if lo is None else lo, view[1] if hi is None else hi
    if not 0 < lo <= hi:
        raise ValueError(f"a log axis needs 0 < lo <= hi, not lo={lo!r}, hi={hi!r}")
    k0 = int(np.floor(np.log(lo) / np.log(base))) - 1
    k1 = int(np.ceil(np.log(hi) / np.log(base))) + 1
    steps = sorted({float(f"{m * float(base) ** k:.12g}") for k in range(k0, k1 + 1)
                    for m in mantissas})
    eps = 1e-9
    if outer:
        lo = max(v for v in steps if v <= lo * (1 + eps))
        hi = min(v for v in steps if v >= hi * (1 - eps))
    ticks = [v for v in steps if lo * (1 - eps) <= v <= hi * (1 + eps)]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.12g}"))
    if outer:                                      # e.g. ax.set_ylim: autoscaling off
        getattr(axis.axes, f"set_{axis.axis_name}lim")(ticks[0], ticks[-1])
    return ticks


class _Action(NamedTuple):
    kind: str
    microbatch: int
    chunk: int


def _action_of(text):
    """A pipeline span's label (``str(pipeline.Action)``: 'F3', 'B2.1') as (kind,
    micro-batch, chunk), or None."""
    match = _ACTION.fullmatch(str(text))
    return _Action(match[1], int(match[2]), int(match[3] or 0)) if match else None


def shade(color: str, chunk: int, chunks: int) -> tuple:
    """Chunk ``chunk`` of ``chunks`` in the colour of its kind: chunk 0 the colour itself,
    later chunks mixed with white (up to half), so interleaved chunks tell apart."""
    rgb = np.array(to_rgb(color))
    mix = 0.55 * chunk / (chunks - 1) if chunks > 1 else 0.0
    return tuple(rgb + (1.0 - rgb) * mix)


def _fits(ax, width: float, text: str, fontsize: float) -> bool:
    """Whether `text` fits in a bar `width` data units wide, at the axes' current scale."""
    x0, x1 = ax.get_xlim()
    pixels = width * ax.get_window_extent().width / abs(x1 - x0) if x1 != x0 else 0.0
    return pixels >= (0.62 * len(text) * fontsize + 2) * ax.figure.dpi / 72


def plot_timeline(ax, timelines: dict, title: str | None = None, unit: str = "ms",
                  colors: dict | None = None, labels: bool = False,
                  legend_outside: bool = False, legend: bool = True,
                  comm_kinds=COMM_KINDS, edgecolor: str = "white") -> list[dict]:
    """Gantt chart: ``timelines[rank] = [(kind, start_s, end_s), ...]`` or
    ``[(kind, start_s, end_s, text), ...]``; one row per rank, rank 0 on top.

    Computation and communication get rows of their own, so that where they overlap in
    time both stay visible: when some row holds both (kinds in ``comm_kinds`` and any
    other kind), every row is drawn as two lanes, computation above ("compute": idle
    and optimizer spans too) and communication below ("comm"), under the rank's label.
    Rows that hold one side only (a pipeline's F/B/W, rows a caller already split as
    ``"bucketed: compute"`` / ``"bucketed: comm"``) stay one bar high.

    Keys that are not ranks (strings such as ``"bucketed: comm"``) label their
    rows as given, in the dict's order. ``legend_outside`` puts the legend to
    the right of the axes, clear of the data (``legend=False``: no legend).

    Pipeline spans (text ``str(Action)``: 'F3', 'B2.1') are coloured by kind and
    shaded by model chunk (legend 'F chunk 1' when a rank holds several); with
    ``labels`` each box shows its micro-batch number (other spans their text)
    where it fits. ``edgecolor`` outlines each box (``"none"``: no outline, for spans
    too thin for one, such as a GPU trace's kernels). Returns what was drawn: one dict per
    span (``row``, ``lane``: "compute", "comm" or None when rows are not split, ``y`` and
    ``height`` of its bar,
    ``kind``, ``microbatch``, ``chunk``, ``color``, ``text`` written or None).
    """
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    colors = {**COLORS, **(colors or {})}
    ranks = sorted(timelines) if all(isinstance(k, int) for k in timelines) else list(timelines)
    actions = {id(sp): _action_of(sp[3]) for r in ranks for sp in timelines[r] if len(sp) > 3}
    chunks = 1 + max((a.chunk for a in actions.values() if a), default=0)
    comm_kinds = frozenset(comm_kinds)
    split = any({sp[0] in comm_kinds for sp in timelines[r]} == {True, False} for r in ranks)
    seen, drawn = {}, []
    for row, rank in enumerate(ranks):
        for span in timelines[rank]:
            kind, start, end = span[:3]
            action = actions.get(id(span))
            color = colors.get(kind, "#999999")
            key = kind
            if action is not None:
                color = shade(color, action.chunk, chunks)
                key = f"{kind} chunk {action.chunk}" if chunks > 1 else kind
            lane = ("comm" if kind in comm_kinds else "compute") if split else None
            y = row + {"compute": -_LANE, "comm": _LANE, None: 0.0}[lane]
            height = _LANE_HEIGHT if split else 0.7
            bar = ax.barh(y, (end - start) * scale, left=start * scale, height=height,
                          color=color, edgecolor=edgecolor, linewidth=0.5)
            seen.setdefault(key, bar)
            drawn.append({"row": row, "lane": lane, "y": y, "height": height, "kind": kind,
                          "start": start * scale, "width": (end - start) * scale,
                          "color": color, "text": None,
                          "microbatch": action.microbatch if action else None,
                          "chunk": action.chunk if action else None})
    if labels:
        _write_labels(ax, [sp for r in ranks for sp in timelines[r]], actions, drawn)
    if any("chunk" in key for key in seen):          # F chunk 0, F chunk 1, B chunk 0, ...
        seen = dict(sorted(seen.items(), key=lambda kv: ("FBW".find(kv[0][0]), kv[0])))
    _finish_timeline(ax, ranks, unit, title, seen if legend else None, legend_outside, split)
    return drawn


def _write_labels(ax, spans, actions, drawn, fontsize: float = 8) -> None:
    ax.autoscale_view()
    for span, box in zip(spans, drawn):
        action = actions.get(id(span))
        text = str(action.microbatch) if action else (str(span[3]) if len(span) > 3 else "")
        if text and _fits(ax, box["width"], text, fontsize):
            light = sum(to_rgb(box["color"])) / 3 > 0.6
            ax.text(box["start"] + box["width"] / 2, box["y"], text, ha="center",
                    va="center", fontsize=fontsize, color="black" if light else "white")
            box["text"] = text


def _finish_timeline(ax, ranks, unit, title, seen, legend_outside, split=False) -> None:
    ax.set_yticks(range(len(ranks)), [f"rank {r}" if isinstance(r, int) else str(r)
                                      for r in ranks])
    if split:                # lane names beside the bars, the rank's name to their left
        lanes = [row + d for row in range(len(ranks)) for d in (-_LANE, _LANE)]
        ax.set_yticks(lanes, ["compute", "comm"] * len(ranks), minor=True)
        ax.tick_params(axis="y", which="minor", labelsize=8, length=0)
        ax.tick_params(axis="y", which="major", length=0, pad=0.6 * 8 * len("compute") + 6)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    if seen is None:
        return
    if legend_outside:
        ax.legend(seen.values(), seen.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  fontsize=8)
    else:
        ax.legend(seen.values(), seen.keys(), loc="upper right", fontsize=7, ncol=len(seen))
