"""One look for every figure of the course, and the label that says who measured it.

Every measured figure carries :func:`machine_label` (CPU model, cores, GPUs,
backend and ranks) via :func:`stamp`, so a plot copied out of a notebook
still says where its numbers came from, and which time it shows: real time
on this machine, or the emulated time of a GPU cluster (``emulated=``, see
:mod:`lecture_lib.emulate`): "emulated H100 + NVLink, measured from the real
code on <machine>". :func:`plot_timeline` draws per-rank
spans (compute, communication, pipeline actions) as a Gantt chart.
"""
from __future__ import annotations

import os
import platform

import matplotlib.pyplot as plt
import torch

from . import emulate

# One colour per kind of work, used by every timeline in the course.
COLORS = {
    "compute": "#4C72B0", "forward": "#4C72B0", "F": "#4C72B0",
    "backward": "#DD8452", "B": "#DD8452", "W": "#55A868",
    "comm": "#C44E52", "communication": "#C44E52", "optimizer": "#8172B3",
    "idle": "#DDDDDD", "bubble": "#DDDDDD",
}


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
                  emulated=None) -> str:
    """E.g. 'measured on Intel Xeon, 2 cores, no GPU; gloo, 4 ranks (one process each)'.

    ``emulated`` (a preset name or an ``emulate.Cluster``): 'emulated H100 +
    NVLink, measured from the real code on Intel Xeon, ...'.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu = f"{gpus} x {torch.cuda.get_device_name(0)}" if gpus else "no GPU"
    text = f"on {cpu_name()}, {os.cpu_count()} cores, {gpu}"
    if emulated is None:
        text = f"measured {text}"
    else:
        text = f"{emulate.label(emulated)}, measured from the real code {text}"
    if backend:
        text += f"; {backend}"
        if world_size:
            text += f", {world_size} ranks (one process each)"
    return text


def stamp(fig, backend: str | None = None, world_size: int | None = None,
          text: str | None = None, emulated=None) -> None:
    """Write who measured the figure, and in which time, in its bottom-right corner.

    ``emulated``: the preset the figure's times were emulated on (None: real time).
    """
    fig.text(0.99, 0.005, text or machine_label(backend, world_size, emulated), ha="right",
             va="bottom", fontsize=8, color="0.4")


def plot_timeline(ax, timelines: dict, title: str | None = None, unit: str = "ms",
                  colors: dict | None = None, labels: bool = False,
                  legend_outside: bool = False) -> None:
    """Gantt chart: ``timelines[rank] = [(kind, start_s, end_s), ...]`` or
    ``[(kind, start_s, end_s, text), ...]``; one row per rank, rank 0 on top.

    Keys that are not ranks (strings such as ``"bucketed: comm"``) label their
    rows as given, in the dict's order. ``legend_outside`` puts the legend to
    the right of the axes, clear of the data.
    """
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    colors = {**COLORS, **(colors or {})}
    ranks = sorted(timelines) if all(isinstance(k, int) for k in timelines) else list(timelines)
    seen = {}
    for row, rank in enumerate(ranks):
        for span in timelines[rank]:
            kind, start, end = span[:3]
            bar = ax.barh(row, (end - start) * scale, left=start * scale, height=0.7,
                          color=colors.get(kind, "#999999"), edgecolor="white", linewidth=0.5)
            seen.setdefault(kind, bar)
            if labels and len(span) > 3:
                ax.text((start + end) / 2 * scale, row, str(span[3]), ha="center",
                        va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" if isinstance(r, int) else str(r)
                                      for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    if legend_outside:
        ax.legend(seen.values(), seen.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  fontsize=8)
    else:
        ax.legend(seen.values(), seen.keys(), loc="upper right", fontsize=7, ncol=len(seen))
