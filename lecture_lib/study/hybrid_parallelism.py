"""The hybrid notebook's hand calculations: training days from 6ND, a rank's place in the grid,
the global batch identity and the bubble it leaves; why 2048 badly placed GPUs barely beat 1024
well placed ones (the step-time model of section 4); and the global gradient norm a clipped
tp x pp run must use (Megatron-LM's clip_grad_norm: squared shard norms summed over the model
parallel ranks, a replicated parameter counted once)."""
from __future__ import annotations

import math
from dataclasses import replace

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
from matplotlib.patches import Patch

from ..costmodel import A100_CLUSTER, H100_CLUSTER, PRESETS, pipeline_bubble
from ..costmodel.steptime import Parallelism, step_time
from ..dims import ParallelDims, Recipe
from ..figures import plots
from ..hybrid import parallelize
from ..mesh import RankGrid, grid_coordinates, grid_groups
from ..metrics import model_flops_per_token, training_days
from ..models import GPT, MarkovText, shard
from . import fmt

LLAMA_TOKENS, LLAMA_GPUS, LLAMA_MFU = 15e12, 2048, 0.40
GRID = ParallelDims(dp=4, pp=2, tp=8).sizes()       # 64 GPUs on nodes of 8 (cp of size 1)
COORD = {"dp": 2, "pp": 1, "cp": 0, "tp": 3}
BATCH, MICRO, DP, PP = 1024, 2, 16, 8


def q1() -> list[str]:
    """The Llama-style 70B on 15T tokens on 2048 H100s at 40% MFU: 6ND and days."""
    n = PRESETS["Llama-style 70B"].num_params
    fpt = model_flops_per_token(int(n))
    days = training_days(fpt, LLAMA_TOKENS, H100_CLUSTER.peak_flops, LLAMA_GPUS, LLAMA_MFU)
    return [f"{fpt * LLAMA_TOKENS:.2e} FLOPs", fmt(H100_CLUSTER.peak_flops / 1e12, "TFLOP/s"),
            fmt(days, "days")]


def rank_of(coord: dict[str, int], dims: dict[str, int]) -> int:
    """The rank with these coordinates (the inverse of mesh.grid_coordinates)."""
    rank = 0
    for name, size in dims.items():
        rank = rank * size + coord[name]
    assert grid_coordinates(rank, dims) == coord
    return rank


def q2() -> list[str]:
    """The rank at (dp 2, pp 1, tp 3) of dp4 x pp2 x tp8, its node and its groups."""
    rank = rank_of(COORD, GRID)
    groups = {d: next(g for g in grid_groups(GRID, d) if rank in g) for d in GRID}
    return [f"rank {rank}", f"node {rank // 8}", f"tp group {groups['tp']}",
            f"pp group {groups['pp']}", f"dp group {groups['dp']}"]


def q3() -> list[str]:
    """Global batch 1024 = micro-batch 2 x m x dp 16: m, and the 1F1B bubble on pp = 8; then
    the same with dp doubled at the same global batch (what if): half the micro-batches."""
    m = BATCH // (MICRO * DP)
    m2 = BATCH // (MICRO * 2 * DP)
    return [f"m = {m}", fmt(100 * pipeline_bubble(PP, m), "%"),
            f"m = {m2}", fmt(100 * pipeline_bubble(PP, m2), "%")]


def q4() -> list[str]:
    """GPT-3 175B, tp across nodes, on 1024 then 2048 A100s (dp 8 -> 16, global batch 1536):
    compute and tp communication both halve; the well-placed 1024-GPU step; the link ratio."""
    gpt3, batch = PRESETS["GPT-3 175B"], 1536
    lecture = Parallelism(ParallelDims(dp=8, tp=8, pp=16), Recipe(microbatch_size=1, zero_stage=1),
                          recompute="full")
    twice = replace(lecture, dims=replace(lecture.dims, dp=16))
    double = replace(A100_CLUSTER, nodes=2 * A100_CLUSTER.nodes)
    inside = step_time(gpt3, lecture, A100_CLUSTER, batch)
    across = step_time(gpt3, replace(lecture, inner="dp"), A100_CLUSTER, batch)
    across2 = step_time(gpt3, replace(twice, inner="dp"), double, batch)
    inside2 = step_time(gpt3, twice, double, batch)
    ratio = A100_CLUSTER.intra.beta / A100_CLUSTER.inter.beta
    return [f"m = {across.microbatches}", f"m = {across2.microbatches}",
            fmt(across.compute, "s"), fmt(across2.compute, "s"),
            fmt(across.tp_comm, "s"), fmt(across2.tp_comm, "s"),
            fmt(across.total, "s"), fmt(across2.total, "s"), fmt(inside.total, "s"),
            fmt(ratio, "x"), fmt(A100_CLUSTER.intra.beta / 1e9, "GB/s"),
            fmt(A100_CLUSTER.inter.beta / 1e9, "GB/s"), fmt(inside2.total, "s")]


# the tp x pp ranks' own gradient norms: (pp0, tp0), (pp0, tp1), (pp1, tp0), (pp1, tp1); and
# a layer norm's, replicated on stage 0's tp ranks
SHARD_NORMS = (6.0, 6.0, 2.0, 3.0)
REPLICATED_NORM, TP, MAX_NORM = 4.0, 2, 1.0


def q5() -> list[str]:
    """The global norm sqrt(sum of squared shard norms + the replicated norm once), the one clip
    factor it gives every rank, the norm counting the replica on both tp ranks, and the factor
    the smallest rank would take if each rank clipped by its own norm."""
    squares = sum(n * n for n in SHARD_NORMS)
    norm = math.sqrt(squares + REPLICATED_NORM ** 2)
    overcounted = math.sqrt(squares + TP * REPLICATED_NORM ** 2)
    local = [math.sqrt(n * n + (REPLICATED_NORM ** 2 if i < TP else 0.0))
             for i, n in enumerate(SHARD_NORMS)]
    return [f"{norm:.2f}", f"{MAX_NORM / norm:.3g}", f"{overcounted:.2f}",
            f"{local[0]:.2f}", f"{MAX_NORM / min(local):.3g}"]


ANSWERS = {"Q1": q1, "Q2": q2, "Q3": q3, "Q4": q4, "Q5": q5}


def gradient_norms(cfg, dims, recipe, batch):
    """Inside a rank: one step's gradients; this rank's own norm, and the global norm
    assembled over the tp and pp groups (replicated parameters counted once, or on every tp
    rank)."""
    grid = RankGrid.from_dims(dims)
    model = parallelize(GPT(cfg, 0), dims, recipe, grid, "sgd", 0.1)
    x, y = shard(MarkovText(cfg.vocab_size, cfg.seq_len).batch(0, batch), grid.coord("dp"), dims.dp)
    model.forward_backward(x, y)
    squares = {"split": 0.0, "replicated": 0.0}
    for p in model.module.parameters():
        if p.grad is not None:
            kind = "split" if getattr(p, "tp_dim", None) is not None else "replicated"
            squares[kind] += float(p.grad.double().pow(2).sum())
    first_tp = grid.coord("tp") == 0
    once = torch.tensor(squares["split"] + squares["replicated"] * first_tp, dtype=torch.float64)
    every = torch.tensor(squares["split"] + squares["replicated"], dtype=torch.float64)
    for total in (once, every):
        for axis in ("tp", "pp"):
            dist.all_reduce(total, group=grid.group(axis))
    return {"coords": grid.coords, "own": sum(squares.values()) ** 0.5,
            "global": once.item() ** 0.5, "every": every.item() ** 0.5}


def steps_figure(steps: dict[str, tuple[float, float]], clip: float, title: str):
    """Section 5's figure: each layout's step (ms) as ``(computing, waiting)``, stacked on a
    linear axis cut at ``clip`` ms; a longer step runs off the axis, its parts labelled."""
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for y, (compute, wait) in enumerate(steps.values()):
        ax.barh(y, compute, color=plots.COLORS["compute"], label="computing" if y == 0 else None)
        ax.barh(y, wait, left=compute, color=plots.COLORS["comm"],
                label="waiting: communication, bubble" if y == 0 else None)
        total = compute + wait
        if total > clip:                              # off the axis: say what it holds
            text, at = (f"{total:.0f} ms, off the axis ({compute:.0f} computing, {wait:.0f} "
                        f"waiting) →"), clip
            ax.annotate(text, (at, y), xytext=(-4, 0), textcoords="offset points", ha="right",
                        va="center", fontsize=8, color="white")
        else:
            ax.annotate(f"{total:.0f} ms", (total, y), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=8)
    ax.set_xlim(0, clip)
    ax.set_yticks(range(len(steps)), list(steps))
    ax.invert_yaxis()
    ax.set_xlabel("time per step (ms, emulated)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    plots.stamp(fig, text="emulated: 8 x H100 (h100-node, or nodes of 4 GPUs joined by "
                "InfiniBand), dry run of the real code")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def layout_text(p) -> str:
    """A planned configuration's layout in one line: dp, pp, tp and its ZeRO stage."""
    d = p.parallelism.dims
    return f"dp {d.dp} · pp {d.pp} · tp {d.tp}, ZeRO-{p.parallelism.recipe.zero_stage}"


def keeps_decisions(plan) -> bool:
    """Section 3's two decisions: tp (if any) inside a node, and not every layer recomputed."""
    par = plan.parallelism
    return (par.dims.tp == 1 or par.inner == "tp") and par.recompute != "full"


def plan_figure(bests: dict, megatron: dict, n_plans: int, model_name: str):
    """Section 3's figure: one bar per constraint (``{label: plan}``, the first the fastest of
    all), each labelled with its modelled step and layout, and ``megatron``'s plans
    (``{label: plan}``, two of them) as dashed vertical lines; seconds, modelled."""
    fastest = next(iter(bests.values())).seconds
    seconds = [p.seconds for p in bests.values()]
    fig, ax = plt.subplots(figsize=(9, 3.4))
    keeps, breaks = "#55A868", "#C44E52"
    bars = ax.barh(list(bests), seconds,
                   color=[keeps if keeps_decisions(p) else breaks for p in bests.values()])
    for bar, p in zip(bars, bests.values()):           # left-aligned, clear of the dashed lines
        ax.text(0.5, bar.get_y() + bar.get_height() / 2,
                f"{p.seconds:.1f} s (+{p.seconds / fastest - 1:.0%}): {layout_text(p)}",
                fontsize=8, ha="left", va="center", color="white")
    for (name, p), side in zip(megatron.items(), ("right", "left")):
        ax.axvline(p.seconds, color="0.3", ls="--", lw=1)
        ax.text(p.seconds + (-0.3 if side == "right" else 0.3), -0.6, f"{name}: {p.seconds:.1f} s",
                fontsize=8, ha=side, va="bottom")
    ax.set_xlim(0, 1.15 * max(seconds))
    ax.set_ylim(len(bests) - 0.5, -1.6)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("seconds per step (modelled)")
    least = min(seconds[1:])
    ax.set_title(f"{model_name} on 1024 A100s: the fastest plan breaking a decision is "
                 f"{least / fastest - 1:.0%} slower", fontsize=10)
    plots.stamp(fig, text=f"modelled: the planner over {n_plans} configurations that fit; "
                "dashed: Megatron-LM's layout")
    key = [Patch(color=keeps, label="keeps both decisions"),
           Patch(color=breaks, label="breaks one")]
    fig.legend(handles=key, loc="lower left", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig
