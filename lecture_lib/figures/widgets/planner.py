"""The configuration planner as a widget: model, cluster and batch in; ranked plans out.

``planner_explorer()`` returns an ipywidgets panel. Every number comes from
:func:`lecture_lib.costmodel.planner.plan` (memory: ZeRO paper and
Korthikanti et al. 2022; time: :mod:`lecture_lib.costmodel.steptime`).
"""
from __future__ import annotations

from dataclasses import replace

import ipywidgets as w
import matplotlib.pyplot as plt

from ...costmodel.memory import PRESETS
from ...costmodel.planner import explain, plan
from ...costmodel.steptime import A100_CLUSTER, H100_CLUSTER
from .. import plots
from . import explorer

CLUSTERS = {"A100 80GB, NVLink 3 + HDR InfiniBand": A100_CLUSTER,
            "H100 80GB, NVLink 4 + NDR InfiniBand": H100_CLUSTER}
PART_COLORS = ["#4C72B0", "#DDDDDD", "#C44E52", "#8172B3", "#DD8452"]


def plan_figure(preset: str, cluster: str, nodes: int, global_batch: int, top: int = 8):
    """A stacked bar per plan (fastest first) of the modelled step time's parts."""
    if preset not in PRESETS or cluster not in CLUSTERS:
        raise ValueError(f"unknown preset {preset!r} or cluster {cluster!r}")
    machine = replace(CLUSTERS[cluster], nodes=nodes)
    plans = plan(PRESETS[preset], machine, global_batch)
    best = plans[:top]
    plots.use_style()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(best) + 1.5))
    for row, p in enumerate(best):
        left = 0.0
        for (part, sec), color in zip(p.time.parts().items(), PART_COLORS):
            ax.barh(row, sec, left=left, color=color, label=part if row == 0 else None)
            left += sec
    ax.set_yticks(range(len(best)), [p.parallelism.label() for p in best], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("modelled seconds per step")
    ax.set_title(f"{preset} on {machine.devices} GPUs, global batch {global_batch}: "
                 f"{len(plans)} configurations fit")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    plots.stamp(fig, text="modelled: lecture_lib.costmodel (alpha-beta links, 1F1B bubble, "
                          "ZeRO + Korthikanti memory)")
    fig.tight_layout()
    return fig, plans


def planner_explorer():
    """The interactive panel (a notebook cell ends with it)."""
    style = {"description_width": "100px"}
    controls = {
        "preset": w.Dropdown(options=list(PRESETS), value="GPT-3 175B", description="model",
                             style=style),
        "cluster": w.Dropdown(options=list(CLUSTERS), description="cluster", style=style),
        "nodes": w.BoundedIntText(128, min=1, max=4096, description="nodes of 8", style=style),
        "global_batch": w.BoundedIntText(1536, min=1, max=1 << 20, description="global batch",
                                         style=style),
    }
    def render(**values):
        fig, plans = plan_figure(**values)
        return fig, {"plans": plans, "text": explain(plans[0], plans)}

    return explorer(controls, render)
