"""The memory calculator: what each device holds for a model under a parallel config.

``memory_calculator()`` returns an ipywidgets panel: a preset (GPT-3 175B,
Llama-style 8B and 70B, the course's small GPT), dp, tp, pp, ZeRO stage,
precision, recomputation, sequence parallelism, micro-batch and sequence
length. It draws a stacked bar of parameters, gradients, optimizer state and
activations per device for every ZeRO stage (the chosen one outlined and its tick marked) and the
line of an 80 GB device. Every number comes from
:func:`lecture_lib.costmodel.memory_per_device` (ZeRO paper; Korthikanti et
al. 2022).
"""
from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt

from ...costmodel.memory import GB, PRECISIONS, PRESETS, RECOMPUTE, memory_per_device
from .. import plots
from ..check import check_figure
from . import explorer

KINDS = ("params", "grads", "optimizer", "activations")
KIND_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#8172B3",
               "activations": "#55A868"}


def plot_memory(ax, breakdowns: dict, device_gb: float = 80.0, highlight: str | None = None,
                title: str | None = None) -> None:
    """Stacked bars, one per ``label -> memory_per_device(...)`` dict, in GB; a device line."""
    labels = list(breakdowns)
    for i, label in enumerate(labels):
        bottom = 0.0
        for kind in KINDS:
            height = breakdowns[label][kind] / GB
            ax.bar(i, height, bottom=bottom, color=KIND_COLORS[kind], width=0.6,
                   label=kind if i == 0 else None, linewidth=0)   # no edge: thin parts show
            bottom += height
        if label == highlight:                                    # one outline round the bar
            ax.bar(i, bottom, width=0.6, fill=False, edgecolor="black", linewidth=1.5)
        ax.text(i, bottom, f"{bottom:,.1f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(device_gb, color="#C44E52", linestyle="--", label=f"{device_gb:g} GB device")
    ax.set_xticks(range(len(labels)), [f"{x}\n(selected)" if x == highlight else x for x in labels])
    ax.set_ylabel("memory per device (GB)")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def calculator_figure(preset: str = "GPT-3 175B", dp: int = 64, tp: int = 8, pp: int = 8,
                      zero_stage: int = 1, precision: str = "mixed (bf16/fp16 + fp32 master)",
                      recompute: str = "selective", sequence_parallel: bool = True,
                      microbatch_size: int = 1, seq_len: int | None = None,
                      device_gb: float = 80.0):
    """The calculator's figure for one setting: every ZeRO stage side by side."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {list(PRESETS)}, not {preset!r}")
    shape = PRESETS[preset]
    bars = {f"ZeRO-{s}": memory_per_device(shape, dp, tp, pp, s, microbatch_size, seq_len,
                                           recompute, sequence_parallel, precision)
            for s in range(4)}
    plots.use_style()
    fig, ax = plt.subplots(figsize=(7, 4))
    plot_memory(ax, bars, device_gb, highlight=f"ZeRO-{zero_stage}",
                title=f"{preset}: dp={dp}, tp={tp}, pp={pp}, micro-batch {microbatch_size}, "
                      f"seq {seq_len or shape.seq_len},\nrecompute {recompute}, "
                      f"sequence parallelism {'on' if sequence_parallel else 'off'}")
    plots.stamp(fig, text="modelled: Rajbhandari et al. 2020 (ZeRO), "
                          "Korthikanti et al. 2022 (activations)")
    fig.tight_layout(rect=(0, 0.05, 1, 1))              # the stamp below the tick labels
    check_figure(fig)
    return fig, bars


def memory_calculator(**initial):
    """The interactive panel (a notebook cell ends with it); ``initial`` sets controls' values,
    e.g. ``memory_calculator(dp=16)``."""
    style = {"description_width": "110px"}
    controls = {
        "preset": w.Dropdown(options=list(PRESETS), value="GPT-3 175B", description="model",
                             style=style),
        "dp": w.BoundedIntText(64, min=1, max=1 << 16, description="dp", style=style),
        "tp": w.BoundedIntText(8, min=1, max=1024, description="tp", style=style),
        "pp": w.BoundedIntText(8, min=1, max=1024, description="pp", style=style),
        "zero_stage": w.Dropdown(options=[0, 1, 2, 3], value=1, description="ZeRO stage",
                                 style=style),
        "precision": w.Dropdown(options=list(PRECISIONS), description="precision", style=style),
        "recompute": w.Dropdown(options=list(RECOMPUTE), value="selective",
                                description="recompute", style=style),
        "sequence_parallel": w.Checkbox(True, description="sequence parallel"),
        "microbatch_size": w.BoundedIntText(1, min=1, max=4096, description="micro-batch",
                                        style=style),
        "seq_len": w.BoundedIntText(2048, min=1, max=1 << 20, description="sequence length",
                                    style=style),
    }
    def render(**values):
        try:
            fig, bars = calculator_figure(**values)
        except ValueError as e:
            raise ValueError(f"not a valid configuration: {e}") from None
        chosen = bars[f"ZeRO-{values['zero_stage']}"]["total"] / GB
        verdict = "fits in" if chosen <= 80 else "does not fit in"
        return fig, {"bars": bars, "text": f"ZeRO-{values['zero_stage']} at dp={values['dp']}, "
                     f"tp={values['tp']}, pp={values['pp']}: {chosen:,.1f} GB per device, "
                     f"{verdict} an 80 GB device"}

    unknown = set(initial) - set(controls)
    if unknown:
        raise ValueError(f"no such control: {sorted(unknown)}")
    for key, value in initial.items():
        controls[key].value = value
    rows = [w.HBox([w.VBox(list(controls.values())[:5]), w.VBox(list(controls.values())[5:])])]
    return explorer(controls, render, rows)
