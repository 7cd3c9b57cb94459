"""The capstone's prediction: each strategy's step on emulated GPUs, before a GPU is rented.

The trainer's own step (:func:`.train.run_step` on a :class:`.strategies.Plan`) runs in the
dry run of the emulation (:mod:`lecture_lib.emulate`: fake tensors, nothing computed, each
operation and collective charged what the preset's GPUs and links would take) on a model
of real size, GPT-2 small by default (:data:`lecture_lib.models.REAL_SIZE`, 124M
parameters, 1024 tokens). :func:`predict` times one strategy on ``world_size`` emulated
GPUs and returns a record of :mod:`.report` (the fields a real run writes to ``--out``);
:func:`predict_strategies` does every strategy on each world size. A prediction also says
how much of its step computes (``compute_seconds``), which a GPU trace shows as kernels.

What the prediction assumes, and a real run must match to be compared with it (the record's
``settings``): bf16 autocast (mixed precision; fp32 weights, gradients and optimizer state),
no activation checkpointing, eager kernel launches (no CUDA graphs, no ``torch.compile``),
and the micro-batches of :func:`strategy_layout`. MFU is against the device's bf16 dense
peak (989 TFLOP/s on the H100 SXM, 312 on the A100). Memory per GPU is the memory model's
(:func:`lecture_lib.costmodel.context_parallel.memory_per_device_cp`: the fp32 states autocast
keeps, 4 + 4 + 8 bytes per parameter divided as the ZeRO stage divides them, bf16 activations
without attention scores, which the fused attention kernel does not keep; the logits are not
counted).
"""
from __future__ import annotations

import time

import torch.distributed as dist

from .. import emulate
from ..costmodel.context_parallel import memory_per_device_cp
from ..costmodel.memory import TransformerShape
from ..dims import ParallelDims, Recipe
from ..hybrid import job_step, rank_batch
from ..hybrid.experiments import random_batch
from ..mesh import RankGrid
from ..models import REAL_SIZE, GPTConfig
from ..progress import progress
from ..runtime import launch
from .report import model_name, record, settings
from .strategies import STRATEGIES, Plan, check_strategy, run_recipe
from .train import run_step

GPT2_SMALL = REAL_SIZE["GPT-2 small"]
GLOBAL_BATCH = 64
"""Sequences per step in the prediction (64 x 1024 tokens): 8 to 16 per GPU on 4 to 8 GPUs."""
STEPS = 2
"""Steps run per prediction; the last is timed (the first also makes the optimizer's state)."""


def strategy_layout(strategy: str, world_size: int, model: GPTConfig = GPT2_SMALL
                    ) -> tuple[ParallelDims, Recipe]:
    """The layout and recipe ``strategy`` runs on ``world_size`` GPUs: data-parallel ones over
    all of them; tp, pp and cp on as many as the model allows (the heads, the layers, the
    sequence), the rest data-parallel; 3d: tp 2 x pp 2 x dp the rest. A pipeline runs
    ``2 pp`` micro-batches (1F1B), everything else the whole local batch at once."""
    def largest(fits) -> int:
        return max(n for n in range(1, world_size + 1) if world_size % n == 0 and fits(n))

    if strategy in ("ddp", "zero1", "zero2", "fsdp"):
        return ParallelDims(dp=world_size), Recipe()
    if strategy == "tp":
        tp = largest(lambda n: model.n_heads % n == 0 and model.vocab_size % n == 0 and n <= 8)
        return ParallelDims(dp=world_size // tp, tp=tp), Recipe()
    if strategy == "pp":
        pp = largest(lambda n: model.n_layers % n == 0)
        return ParallelDims(dp=world_size // pp, pp=pp), Recipe(microbatches=2 * pp)
    if strategy == "cp":
        cp = largest(lambda n: model.seq_len % (2 * n) == 0)
        return ParallelDims(dp=world_size // cp, cp=cp), Recipe()
    if strategy == "3d":
        return ParallelDims(dp=world_size // 4, tp=2, pp=2), Recipe(microbatches=4)
    raise ValueError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")


def predict_on_rank(strategy: str, model: GPTConfig, dims: ParallelDims, recipe: Recipe,
                    global_batch: int, preset="h100-node", dry_run: bool = True,
                    precision: str = "bf16", steps: int = STEPS) -> dict:
    """Rank function: ``steps`` of the capstone's training step in the virtual time of
    ``preset`` on random tokens (fake ones in the dry run); when each step started and ended
    on this rank (its streams synchronised), the state it holds, and its whole clock."""
    grid = RankGrid.from_dims(dims)            # process groups: made outside the emulation
    starts, ends = [], []
    with emulate.emulated(preset, dry_run=dry_run) as clock:
        plan = Plan(strategy, model, dims, run_recipe(strategy, recipe), grid, lr=1e-3)
        for step in range(steps):
            x, y = rank_batch(random_batch(model, global_batch, step), dims, recipe, grid)
            starts.append(clock.synchronize())
            run_step(plan, x, y, precision)
            ends.append(clock.synchronize())
        held = plan.held()
    return {"starts": starts, "ends": ends, "held": held,
            "clock": {**clock.summary(), "issued": list(clock.issued)}}


def modelled_memory(model: GPTConfig, dims: ParallelDims, zero_stage: int, microbatch: int) -> dict:
    """Bytes per GPU by kind (params, grads, optimizer, activations, total) that a prediction
    reports: :func:`memory_per_device_cp` at ``dims``, ``zero_stage`` and ``microbatch``, with
    the states bf16 autocast keeps (fp32 weights, gradients and AdamW state) and 16-bit
    activations. The course's GPT runs ``scaled_dot_product_attention``, a fused kernel that
    keeps no attention scores, so the activations are Korthikanti et al.'s count without them:
    the count selective recomputation gives (nothing is recomputed here)."""
    shape = TransformerShape(model_name(model), model.n_layers, model.d_model, model.n_heads,
                             model.vocab_size, model.seq_len, model.num_params())
    return memory_per_device_cp(shape, dims.cp, dims.dp, dims.tp, dims.pp, zero_stage, microbatch,
                                recompute="selective",
                                precision="autocast (bf16 compute, fp32 weights)")


def predict(strategy: str, world_size: int, preset="h100-node", model: GPTConfig = GPT2_SMALL,
            global_batch: int = GLOBAL_BATCH, timeout: float = 600) -> dict:
    """The predicted record of ``strategy`` on ``world_size`` GPUs of ``preset`` (see the
    module's docstring for what it assumes), with ``wall_seconds``: what the dry run took."""
    dims, recipe = strategy_layout(strategy, world_size, model)
    run = check_strategy(strategy, model, dims, recipe, global_batch, world_size)
    cluster = emulate.preset(preset)
    began = time.perf_counter()
    results = launch.run(predict_on_rank, world_size, strategy, model, dims, recipe,
                         global_batch, cluster, timeout=timeout)
    wall = time.perf_counter() - began
    step = job_step(results)
    m, b = run.split(global_batch, dims.dp)
    memory = modelled_memory(model, dims, run.zero_stage, b)
    device = cluster.device
    out = record(strategy, dims, run, model, global_batch, step=step, spread=[step, step],
                 peak_flops=device.bf16_flops,
                 peak=f"{device.name} bf16 dense peak, {device.bf16_flops / 1e12:g} TFLOP/s",
                 memory=memory["total"],
                 memory_kind="modelled: fp32 weights, gradients and AdamW state (ZeRO paper's "
                             "stages) + bf16 activations (Korthikanti et al. 2022), logits not "
                             "counted",
                 time_kind=f"{emulate.label(cluster)} (dry run)",
                 hardware=f"{world_size} x {device.name}, {cluster.gpus_per_node} per node",
                 timing=f"emulated: step {STEPS} of {STEPS} (the first dropped), from the end "
                        "of the step before on every rank to the end of this one on every "
                        "rank; no noise, so no spread",
                 settings=settings("bf16", cluster.launch if cluster.calibrated else "roofline",
                                   m, b))
    held = max(sum(r["held"].values()) for r in results)
    return {**out, "state_bytes_counted": held, "compute_seconds": step_compute(results),
            "rank_compute_seconds": [rank_compute(r) for r in results], "wall_seconds": wall}


def rank_compute(result: dict) -> float:
    """Seconds one rank's compute stream was busy in its timed (last) step."""
    start, end = result["starts"][-1], result["ends"][-1]
    return sum(min(e, end) - max(s, start) for kind, s, e, *_ in result["clock"]["spans"]
               if kind not in ("comm", "idle") and e > start and s < end)


def step_compute(results: list[dict]) -> float:
    """Seconds the compute stream was busy in the timed (last) step, on the rank that ended
    it last: the step less its ``compute_seconds`` is communication and waiting nothing hid."""
    return rank_compute(max(results, key=lambda r: r["ends"][-1]))


def predict_strategies(world_sizes=(4, 8), presets=("h100-node",), strategies=STRATEGIES,
                       model: GPTConfig = GPT2_SMALL, global_batch: int = GLOBAL_BATCH,
                       timeout: float = 600, show: str | None = None) -> list[dict]:
    """:func:`predict` for every (preset, world size, strategy); every layout is checked
    before the first run starts."""
    jobs = [(p, w, s) for p in presets for w in world_sizes for s in strategies]
    for p, w, s in jobs:
        emulate.preset(p)
        dims, recipe = strategy_layout(s, w, model)
        check_strategy(s, model, dims, recipe, global_batch, w)
    return [predict(s, w, p, model, global_batch, timeout)
            for p, w, s in progress(jobs, "predict each strategy (dry run)", show=show)]


def same_clock_real_and_dry(strategy: str, model: GPTConfig, dims: ParallelDims,
                            recipe: Recipe, global_batch: int, preset="h100-node") -> dict:
    """Rank function for the tests: :func:`predict_on_rank` on real tensors, then in the dry
    run; both clocks (``{False: ..., True: ...}``), equal to the last bit."""
    out = {}
    for dry_run in (False, True):
        out[dry_run] = predict_on_rank(strategy, model, dims, recipe, global_batch, preset,
                                       dry_run)["clock"]
        dist.barrier()
    return out
