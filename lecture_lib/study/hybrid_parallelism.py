"""The hybrid notebook's hand calculations: training days from 6ND, a rank's place in the grid,
the global batch identity and the bubble it leaves."""
from __future__ import annotations

from ..costmodel import H100_CLUSTER, PRESETS, pipeline_bubble
from ..dims import ParallelDims
from ..mesh import grid_coordinates, grid_groups
from ..metrics import model_flops_per_token, training_days
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
    """Global batch 1024 = micro-batch 2 x m x dp 16: m, and the 1F1B bubble on pp = 8."""
    m = BATCH // (MICRO * DP)
    return [f"m = {m}", fmt(100 * pipeline_bubble(PP, m), "%")]


ANSWERS = {"Q1": q1, "Q2": q2, "Q3": q3}
