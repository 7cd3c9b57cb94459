"""What a capstone run reports, measured or predicted: one record with the same fields.

A real run (``examples/train_gpt2.py ... --out run.json``) and a prediction
(``--emulate h100-node --dry-run``, :mod:`.predict`) both write records with the fields
of :data:`FIELDS`, so that :mod:`.compare` can set a measured step beside a predicted one:

* ``step_time`` (seconds; the median of the timed steps, the first :data:`WARMUP` steps
  dropped), ``step_time_spread`` (their minimum and maximum), ``tokens_per_s``;
* ``mfu``: model FLOPs (``6 N + 12 L s h`` per token, Chowdhery et al. 2022) over
  ``peak_flops`` per device, ``peak`` saying which peak;
* ``memory_per_gpu`` (bytes) and ``memory_kind`` (CUDA's peak allocation, the state a CPU
  rank holds, or the memory model);
* ``time_kind`` (``"real"``, ``"emulated ..."``), ``hardware``, ``timing`` (how the step
  was timed), ``settings`` (precision, activation checkpointing, kernel launches,
  micro-batches: what a real run must use to match a prediction).
"""
from __future__ import annotations

import os
import statistics

import torch
import torch.distributed as dist

from ..costmodel import flops
from ..metrics import model_flops_per_token, wall_time
from ..models import GPT, REAL_SIZE, GPTConfig
from .strategies import run_recipe

FIELDS = ("strategy", "world_size", "layout", "recipe", "model", "global_batch", "seq_len",
          "step_time", "step_time_spread", "tokens_per_s", "mfu", "peak_flops", "peak",
          "memory_per_gpu", "memory_kind", "time_kind", "hardware", "timing", "settings")
WARMUP = 1
"""Steps dropped before timing (allocations, the optimizer's first state, warm caches)."""


def run_record(cfg, result: dict) -> dict:
    """The record of a real (or emulated) run of :func:`.train.train_on_rank`: ``cfg`` its
    :class:`~.train.TrainConfig`, ``result`` rank 0's result."""
    seconds = result["step_seconds"]
    timed = seconds[WARMUP:] or seconds
    step = statistics.median(timed)
    last = result["log"][-1]
    recipe = run_recipe(cfg.strategy, cfg.recipe)
    m, b = recipe.split(cfg.global_batch, cfg.dims.dp)
    return record(cfg.strategy, cfg.dims, recipe, cfg.model, cfg.global_batch,
                  step=step, spread=[min(timed), max(timed)], peak_flops=result["peak_flops"],
                  peak=result["peak"], memory=max(last["peak_bytes"]),
                  memory_kind=result["memory_kind"], time_kind=result["time_kind"],
                  hardware=result["hardware"],
                  timing=f"median of {len(timed)} steps after {len(seconds) - len(timed)} "
                         "warm-up step(s) dropped; spread: min-max of those steps",
                  settings=settings(cfg.precision, "eager", m, b))


def record(strategy, dims, recipe, model: GPTConfig, global_batch: int, *, step, spread,
           peak_flops, peak, memory, memory_kind, time_kind, hardware, timing,
           settings) -> dict:
    """A record of :data:`FIELDS`: tokens/s and MFU worked out from ``step`` seconds."""
    tokens_s = global_batch * model.seq_len / step
    per_token = model_flops_per_token(model.num_params(embeddings=False), model.n_layers,
                                      model.seq_len, model.d_model)
    return {"strategy": strategy, "world_size": dims.world_size, "layout": dims.label(),
            "recipe": recipe.label(), "model": model_name(model), "global_batch": global_batch,
            "seq_len": model.seq_len, "step_time": step, "step_time_spread": spread,
            "tokens_per_s": tokens_s,
            "mfu": flops.mfu(tokens_s, per_token, peak_flops, dims.world_size),
            "peak_flops": peak_flops, "peak": peak, "memory_per_gpu": memory,
            "memory_kind": memory_kind, "time_kind": time_kind, "hardware": hardware,
            "timing": timing, "settings": settings}


def settings(precision: str, launch: str, microbatches: int, microbatch_size: int) -> dict:
    """What a real run must match: precision, activation checkpointing (the trainer has
    none), kernel launches (eager, CUDA graphs), micro-batches and their size."""
    return {"precision": {"bf16": "bf16 autocast (fp32 weights and optimizer)",
                          "fp32": "fp32"}[precision],
            "activation checkpointing": "none", "launches": launch,
            "micro-batches": microbatches, "micro-batch size": microbatch_size}


def model_name(model: GPTConfig) -> str:
    """``"GPT-2 small"`` for a model of that shape in :data:`~lecture_lib.models.REAL_SIZE`
    (any vocabulary), else its shape."""
    shape = (model.n_layers, model.d_model, model.n_heads, model.seq_len)
    for name, known in REAL_SIZE.items():
        if (known.n_layers, known.d_model, known.n_heads, known.seq_len) == shape:
            return name
    return f"GPT {model.n_layers} x {model.d_model}, context {model.seq_len}"


def hardware(device: torch.device) -> str:
    """What this rank runs on: the GPU's name, or the CPU's cores; ranks and backend."""
    ranks = f"{dist.get_world_size()} ranks, {dist.get_backend()}"
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, {ranks}"
    return f"CPU ({os.cpu_count()} cores), {ranks}"


def non_embedding_params(m: GPTConfig) -> int:
    """Parameters of the course's GPT less the two embedding tables (MFU's N), counted by
    :func:`lecture_lib.costmodel.flops.non_embedding_params` on a GPT of that shape built on
    the meta device (no memory)."""
    with torch.device("meta"):
        return flops.non_embedding_params(GPT(m))


def measured_peak_flops(dev: torch.device, n: int | None = None, reps: int = 5,
                        trials: int = 3) -> float:
    """FLOP/s of a dense fp32 matmul on this rank's device, the best of ``trials`` timings
    of ``reps`` products (MFU's denominator when no ``peak_flops`` is given)."""
    n = n or (4096 if dev.type == "cuda" else 384)
    a = torch.randn(n, n, device=dev)
    a @ a
    best = 0.0
    for _ in range(trials):
        with wall_time(dev) as t:
            for _ in range(reps):
                a @ a
        best = max(best, 2 * n ** 3 * reps / max(t.seconds, 1e-9))
    return best


def format_table(records: list[dict]) -> str:
    """The records as a table (strategy, GPUs, layout, micro-batches, step, tokens/s, MFU,
    memory per GPU, time), then what each kind of time is measured against and how."""
    lines = [f"{'strategy':>9} {'GPUs':>4} {'layout':>16} {'m x mb':>7} {'step (ms)':>10} "
             f"{'tokens/s':>11} {'MFU':>6} {'GB/GPU':>7}  time"]
    for r in records:
        cut = f"{r['settings']['micro-batches']} x {r['settings']['micro-batch size']}"
        lines.append(f"{r['strategy']:>9} {r['world_size']:>4} {r['layout']:>16} {cut:>7} "
                     f"{r['step_time'] * 1e3:>10.2f} {r['tokens_per_s']:>11,.0f} "
                     f"{r['mfu']:>6.1%} {r['memory_per_gpu'] / 1e9:>7.2f}  {r['time_kind']}")
    for kind in dict.fromkeys(r["time_kind"] for r in records):
        first = next(r for r in records if r["time_kind"] == kind)
        settings = ", ".join(f"{k} {v}" for k, v in first["settings"].items()
                             if k not in ("micro-batches", "micro-batch size"))
        lines.append(f"{kind}: MFU against {first['peak']}; memory: {first['memory_kind']}; "
                     f"timing: {first['timing']}; settings: {settings}")
    return "\n".join(lines)
