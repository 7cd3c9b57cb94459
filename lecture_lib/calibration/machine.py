"""Calibrate the step-time model on this machine, then check what it predicts.

A cost model is only as good as its constants. Here we measure two of them on
the machine at hand and keep everything else as the formulas of
:mod:`lecture_lib.costmodel.steptime` say:

1. the compute of one rank: two one-rank training steps of the small GPT on the
   same batch, cut into 1 and into ``m`` micro-batches, do the same FLOPs
   (:func:`~lecture_lib.costmodel.steptime.training_flops`); the difference is
   the fixed cost per layer and micro-batch (``layer_overhead``) and what is
   left of the first is FLOPs at the rank's rate. Ranks beyond the number of
   cores share them, so a "device" here runs at ``rate * min(1, cores / ranks)``;
2. the link: alpha and beta from a fit of measured all-reduce times
   (:func:`lecture_lib.bandwidth.bandwidth_sweep` and ``fit_sweep``), turned
   into per-step latency and bandwidth with the ring formula
   (all-reduce = ``2 (p-1) alpha + 2 (p-1)/p n / beta``).

Then :func:`predict_vs_measured` trains the small GPT under several configurations (a
layout, :class:`lecture_lib.dims.ParallelDims`, and a recipe, :class:`lecture_lib.dims.
Recipe`) with :mod:`lecture_lib.hybrid`, and sets the measured step time beside the model's
prediction.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from ..bandwidth import bandwidth_sweep, fit_sweep
from ..costmodel.comm import Link, bus_factor
from ..costmodel.memory import TransformerShape
from ..costmodel.steptime import Cluster, Parallelism, step_time, training_flops
from ..dims import ParallelDims, Recipe
from ..hybrid import step_seconds, train_hybrid
from ..models import GPT, GPTConfig
from ..progress import progress
from ..runtime import launch


def shape_of(cfg: GPTConfig) -> TransformerShape:
    """The cost model's view of a :class:`GPTConfig`, with its exact parameter count; its
    token and position tables are looked up (the course's GPT has an untied head)."""
    n = sum(p.numel() for p in GPT(cfg).parameters())
    return TransformerShape("small GPT", cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.vocab_size,
                            cfg.seq_len, n, n - cfg.num_params(embeddings=False))


def measure_link(world_size: int = 2, sizes=(2 ** 12, 2 ** 16, 2 ** 20, 2 ** 22),
                 repeats: int = 5, warmup: int = 3) -> Link:
    """Per-hop alpha (s) and beta (bytes/s) of this machine's links, from all-reduce times."""
    rows = launch.run(bandwidth_sweep, world_size, list(sizes), ("all_reduce",), ("torch",),
                      warmup, repeats)[0]
    a, b = fit_sweep(rows)[("all_reduce", "torch", world_size)]
    p = world_size
    return Link(f"this machine, measured ({launch.choose_backend(p)})",
                alpha=a / (2 * (p - 1)), beta=b * bus_factor("all_reduce", p),
                source="fitted to all-reduce times measured here")


class ComputeFit(NamedTuple):
    """What :func:`measure_compute` found: the rank's FLOP/s, the seconds per layer and
    micro-batch, and the two measured step times (1 and ``microbatches`` micro-batches;
    the fastest of the repeats) they were fitted to."""
    rate: float
    overhead: float
    seconds: tuple[float, float]


def fit_compute(cfg: GPTConfig, batch_size: int, microbatches: int,
                seconds_one: float, seconds_many: float) -> ComputeFit:
    """Solve for ``(rate, overhead)`` from one-rank step times with 1 and ``microbatches``
    micro-batches (the same FLOPs, ``microbatches - 1`` more passes through every layer)."""
    overhead = max(seconds_many - seconds_one, 0.0) / ((microbatches - 1) * cfg.n_layers)
    compute = seconds_one - overhead * cfg.n_layers
    if compute <= 0:
        raise ValueError(f"inconsistent timings: {microbatches} micro-batches took "
                         f"{seconds_many * 1e3:.2f} ms against {seconds_one * 1e3:.2f} ms for "
                         f"one, more than the fixed cost alone could explain; measure again "
                         f"with more steps or repeats, on a quieter machine")
    flops = training_flops(shape_of(cfg), batch_size * cfg.seq_len)
    return ComputeFit(flops / compute, overhead, (seconds_one, seconds_many))


def measure_compute(cfg: GPTConfig, batch_size: int, microbatches: int = 4,
                    steps: int = 6, repeats: int = 3) -> ComputeFit:
    """Time one rank's training step with 1 and ``microbatches`` micro-batches, ``repeats``
    times in turn, and fit to the fastest of each (other work on the machine only adds time,
    so the minimum is the least disturbed measurement, as with ``timeit``)."""
    if batch_size % microbatches or microbatches < 2:
        raise ValueError("need microbatches >= 2 dividing the batch")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, not {repeats!r}")
    seconds = {1: [], microbatches: []}
    runs = [m for _ in range(repeats) for m in seconds]         # alternate 1 and m
    for m in progress(runs, "calibration: one-rank runs (1 and m micro-batches)"):
        _, results = train_hybrid(cfg, ParallelDims(), Recipe(microbatches=m), batch_size,
                                  steps)
        seconds[m].append(step_seconds(results))
    return fit_compute(cfg, batch_size, microbatches, min(seconds[1]), min(seconds[microbatches]))


def machine_cluster(rate: float, overhead: float, link: Link, ranks: int,
                    cores: int | None = None) -> Cluster:
    """This machine as the model sees it: ``ranks`` devices in one node sharing ``cores``."""
    cores = cores or os.cpu_count() or 1
    share = min(1.0, cores / ranks)
    return Cluster("this machine", 1, ranks, rate * share, float("inf"), link, link,
                   efficiency=1.0, layer_overhead=overhead / share)


def predict_on(cfg: GPTConfig, dims: ParallelDims, recipe: Recipe, batch_size: int,
               cluster: Cluster, optimizer: str = "adamw"):
    """The model's :class:`~lecture_lib.costmodel.steptime.StepTime` for one run of
    :func:`lecture_lib.hybrid.train_hybrid` with ``dims`` and ``recipe`` on ``cluster``: fp32
    values, as the course trains, and the gradient all-reduce after the pipeline, as
    ``hybrid`` does."""
    return step_time(shape_of(cfg), Parallelism(dims, recipe, dp_overlap=False), cluster,
                     batch_size, value_bytes=4, optimizer=optimizer)


def predict(cfg: GPTConfig, dims: ParallelDims, recipe: Recipe, batch_size: int, rate: float,
            overhead: float, link: Link):
    """:func:`predict_on` this machine (:func:`machine_cluster`) for the small GPT."""
    return predict_on(cfg, dims, recipe, batch_size,
                      machine_cluster(rate, overhead, link, dims.world_size))


def predict_vs_measured(cfg: GPTConfig, configs: list[tuple[ParallelDims, Recipe]],
                        batch_size: int, rate: float, overhead: float, link: Link,
                        steps: int = 6) -> list[dict]:
    """For each ``(layout, recipe)``: the modelled and the measured seconds per step."""
    rows = []
    for dims, recipe in progress(list(configs), "predicted vs measured: train each layout"):
        _, results = train_hybrid(cfg, dims, recipe, batch_size, steps)
        predicted = predict(cfg, dims, recipe, batch_size, rate, overhead, link)
        rows.append({"config": (dims, recipe), "predicted": predicted.total,
                     "measured": step_seconds(results), "parts": predicted.parts()})
    return rows


def spearman(a, b) -> float:
    """Rank correlation of two sequences (no ties expected in timings)."""
    ra, rb = (np.argsort(np.argsort(np.asarray(x))) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])
