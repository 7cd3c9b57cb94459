"""The planners' search space: every layout and recipe that divides a model on a cluster.

A configuration is a :class:`~.steptime.Parallelism`: the degrees ``dp x tp x pp`` (their
product the devices), a micro-batch size, a ZeRO stage, recomputation, and the axis whose
ranks are adjacent (inside a node first). :func:`candidates` lists those that divide the
devices, the layers, the heads and the batch; the planners (:mod:`.planner`) time and rank
them.
"""
from __future__ import annotations

from ..dims import ParallelDims, Recipe
from .memory import TransformerShape
from .steptime import AXES, Parallelism

MICRO_BATCHES = (1, 2, 4, 8)
ZERO = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(shape: TransformerShape, devices: int, global_batch: int,
               gpus_per_node: int = 8):
    """Every configuration that divides the devices, the layers, the heads and the batch."""
    for tp in divisors(devices):
        if shape.heads % tp or tp > gpus_per_node:      # tensor parallel never spans nodes
            continue
        for pp in divisors(devices // tp):
            if shape.layers % pp:
                continue
            dp = devices // (tp * pp)
            for mb in MICRO_BATCHES:
                if global_batch % (dp * mb):
                    continue
                m = global_batch // (dp * mb)
                if pp > 1 and m < pp:                      # 1F1B needs m >= p to fill the pipe
                    continue
                for zero in ZERO if dp > 1 else (0,):
                    for rc in RECOMPUTE:
                        for inner in AXES:
                            if {"dp": dp, "tp": tp, "pp": pp}[inner] == 1 and inner != "tp":
                                continue                   # placing a size-1 axis changes nothing
                            yield Parallelism(ParallelDims(dp=dp, tp=tp, pp=pp),
                                              Recipe(microbatch_size=mb, zero_stage=zero),
                                              rc, inner)
