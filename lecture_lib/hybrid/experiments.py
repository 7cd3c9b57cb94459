"""What the notebooks run with the hybrid trainer: small models trained, real sizes timed.

Every run builds the same :class:`~.gpt.RankModel` (:func:`build`), feeds it its
share of the batch (:func:`rank_batch`: the dp shard, then the cp slice) and takes a step:
``model.forward_backward(x, y)``, then ``model.update()``:

* :func:`train_hybrid` trains a small GPT on ``dp * tp * pp * cp`` real ranks and merges
  the result (equal to one process); each rank's phases are timed in real time by watching
  the spans the step marks (:mod:`lecture_lib.observe`).
* :func:`emulated_steps` is the rank function that times the same steps on an emulated
  cluster: on real tensors, or with ``dry_run=True`` on fake ones (a model of real size,
  nothing computed; the same clock to the last bit). :func:`time_at_scale` runs it for a
  list of layouts and returns the step, its compute / communication / exposed split, the
  timeline of one step and the bytes sent: plain data for a notebook.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .. import emulate, observe
from ..context_parallel import shard_sequence
from ..costmodel.flops import model_flops_per_token
from ..costmodel.traffic import check_optimizer
from ..dims import ParallelDims, Recipe
from ..mesh import RankGrid
from ..models import GPT, GPTConfig, MarkovText, TrainResult, shard
from ..progress import progress
from ..runtime import launch
from .gpt import RankModel, check_hybrid, parallelize

PRECISIONS = ("fp32", "bf16")
"""How :func:`emulated_steps` computes: fp32, or bf16 autocast (fp32 weights, gradients and
optimizer state; matrix multiplies and their outputs in bf16), as the capstone's ``--precision``."""

PHASES = ("pipeline", "dp sync", "cp sync", "forward-backward", "optimizer")
"""The spans a :class:`RankModel` step marks, which together make the step."""


def train_hybrid(cfg: GPTConfig, dims: ParallelDims, recipe: Recipe, batch_size: int,
                 steps: int, lr: float = 1e-2, seed: int = 0, data_seed: int = 0,
                 optimizer: str = "adamw", timeout: float = 300
                 ) -> tuple[TrainResult, list[dict]]:
    """Train on ``dp * tp * pp * cp`` ranks; the merged result and every rank's own report."""
    check_hybrid(cfg, dims, recipe, batch_size)
    check_optimizer(optimizer)
    results = launch.run(train_on_rank, dims.world_size, cfg, dims, recipe, batch_size, steps,
                         lr, seed, data_seed, optimizer, timeout=timeout)
    return merge_ranks(results, dims), results


def train_on_rank(cfg: GPTConfig, dims: ParallelDims, recipe: Recipe, batch_size: int,
                  steps: int, lr: float = 1e-2, seed: int = 0, data_seed: int = 0,
                  optimizer: str = "adamw") -> dict:
    """Rank function: train this rank's piece on :class:`MarkovText`; its losses, the full
    parameters of its piece, and the real seconds per step of each phase the step marks
    (the first step, a warm-up, is not timed)."""
    grid = RankGrid.from_dims(dims)
    model = build(cfg, dims, recipe, grid, optimizer, lr, seed)
    data, losses, timed = MarkovText(cfg.vocab_size, cfg.seq_len, data_seed), [], []
    for step in range(steps):
        x, y = rank_batch(data.batch(step, batch_size), dims, recipe, grid)
        with observe.watch() as seen:
            loss = model.step(x, y)
        if loss is not None:
            losses.append(float(loss))
        if step > 0 or steps == 1:
            timed.append(seen.totals())
    phases = [k for k in PHASES if any(k in t for t in timed)]
    return {"coords": grid.coords, "losses": losses, "params": model.full_params(),
            "step_seconds": {k: sum(t.get(k, 0.0) for t in timed) / len(timed)
                             for k in phases}}


def build(cfg: GPTConfig, dims: ParallelDims, recipe: Recipe, grid: RankGrid,
          optimizer: str = "adamw", lr: float = 1e-2, seed: int = 0) -> RankModel:
    """This rank's :class:`RankModel`: the GPT of ``seed`` on this rank's device, parallelised."""
    return parallelize(GPT(cfg, seed).to(launch.device()), dims, recipe, grid, optimizer, lr)


def rank_batch(batch, dims: ParallelDims, recipe: Recipe, grid: RankGrid) -> tuple:
    """This rank's part of a global ``(inputs, targets)``: its dp shard, then its cp slice."""
    x, y = shard(batch, grid.coord("dp"), dims.dp)
    return tuple(shard_sequence(t, grid.coord("cp"), dims.cp, recipe.cp_layout) for t in (x, y))


def random_batch(cfg: GPTConfig, batch_size: int, step: int) -> tuple:
    """A global batch of random tokens, the same on every rank (emulated time depends on
    shapes only, and a dry run makes them fake)."""
    g = torch.Generator().manual_seed(1_000_003 * step)
    seq = torch.randint(cfg.vocab_size, (batch_size, cfg.seq_len + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def step_seconds(results: list[dict]) -> float:
    """Measured seconds per step: the slowest rank's (a step ends when every rank is done)."""
    return max(sum(r["step_seconds"].values()) for r in results)


def merge_ranks(results: list[dict], dims: ParallelDims) -> TrainResult:
    """One :class:`TrainResult`: the batch's loss per step (mean over the dp replicas and the
    cp slices, all of equal size) and the full parameters (each stage's, from its dp=0, tp=0,
    cp=0 rank)."""
    last = [r["losses"] for r in results if r["coords"]["pp"] == dims.pp - 1
            and r["coords"]["tp"] == 0]
    losses = [sum(step) / len(step) for step in zip(*last)]
    params = {}
    for r in results:
        if r["coords"]["dp"] == 0 and r["coords"]["tp"] == 0 and r["coords"]["cp"] == 0:
            params.update(r["params"])
    return TrainResult(losses, params)


# ----------------------------------------------------------------------------
# The same step on an emulated cluster, at any size
# ----------------------------------------------------------------------------

def emulated_steps(cfg: GPTConfig, dims: ParallelDims, recipe: Recipe, batch_size: int,
                   steps: int = 2, preset="h100-node", dry_run: bool = False,
                   optimizer: str = "adamw", lr: float = 1e-2, precision: str = "fp32") -> dict:
    """Rank function: ``steps`` training steps in the virtual time of ``preset``, on random
    tokens, in ``precision`` (:data:`PRECISIONS`); when each step started and ended
    (``starts``, ``ends``: the rank's streams synchronised), what the clock counted in the
    last one (``last``: totals by kind, bytes by kind, the timeline from its start) and
    everything it knows (``clock``: for the equality tests)."""
    grid = RankGrid.from_dims(dims)            # process groups: made outside the emulation
    starts, ends, before = [], [], {}
    with emulate.emulated(preset, dry_run=dry_run) as clock:
        model = build(cfg, dims, recipe, grid, optimizer, lr)
        for step in range(steps):
            x, y = rank_batch(random_batch(cfg, batch_size, step), dims, recipe, grid)
            starts.append(clock.synchronize())
            before = _counters(clock)
            with torch.autocast(launch.device().type, dtype=torch.bfloat16,
                                enabled=precision == "bf16"):
                model.forward_backward(x, y)
            model.update()
            ends.append(clock.synchronize())
    return {"coords": grid.coords, "starts": starts, "ends": ends,
            "last": _since(clock, starts[-1], before),
            "clock": {**clock.summary(), "issued": list(clock.issued)}}


def job_step(results: list[dict]) -> float:
    """The job's last step, from :func:`emulated_steps` on every rank: from the end of the
    step before on every rank (or, for a single step, its start on every rank) to its end on
    every rank (a rank may start its next step early; the job's steps come at this pace)."""
    before = [r["ends"][-2] if len(r["ends"]) > 1 else r["starts"][-1] for r in results]
    return max(r["ends"][-1] for r in results) - max(before)


def _counters(clock) -> dict:
    return {"totals": dict(clock.totals), "bytes": dict(clock.bytes_by_kind),
            "spans": len(clock.spans), "by_op": dict(clock.seconds_by_op)}


def _since(clock, start: float, before: dict) -> dict:
    """What the clock counted since ``start`` (the counters it had then: ``before``)."""
    delta = {k: v - before["totals"].get(k, 0.0) for k, v in clock.totals.items()}
    sent = {k: v - before["bytes"].get(k, 0) for k, v in clock.bytes_by_kind.items()}
    spans = [(k, s - start, e - start, t) for k, s, e, t in clock.spans[before["spans"]:]]
    by_op = {k: v - before["by_op"].get(k, 0.0) for k, v in clock.seconds_by_op.items()}
    return {"totals": delta, "bytes": {k: v for k, v in sent.items() if v}, "spans": spans,
            "by_op": {k: v for k, v in by_op.items() if v}}


def time_at_scale(layouts: dict, cfg: GPTConfig, batch_size: int, preset="h100-node",
                  steps: int = 2, timeout: float = 600, show: str | None = None,
                  precision: str = "fp32") -> list[dict]:
    """Time one training step of ``cfg`` (e.g. ``models.real_size("GPT-2 medium")``) under
    each layout ``{name: (ParallelDims, Recipe)}`` in the dry run of the emulation, in
    ``precision``: ``"fp32"``, or ``"bf16"`` autocast as a PyTorch mixed-precision run (its
    messages then have that run's bytes); a row per layout (see :func:`scale_row`). Nothing
    is computed: fake tensors, emulated time."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    for dims, recipe in layouts.values():
        check_hybrid(cfg, dims, recipe, batch_size)
    emulate.preset(preset)                                # an unknown preset: before any rank
    rows = []
    for name in progress(list(layouts), "time each layout at scale (dry run)", show=show):
        dims, recipe = layouts[name]
        began = time.perf_counter()
        results = launch.run(emulated_steps, dims.world_size, cfg, dims, recipe, batch_size,
                             steps, preset, True, precision=precision, timeout=timeout)
        rows.append(scale_row(name, cfg, dims, recipe, batch_size, preset, results,
                              time.perf_counter() - began))
    return rows


def scale_row(name: str, cfg: GPTConfig, dims: ParallelDims, recipe: Recipe, batch_size: int,
              preset, results: list[dict], wall_seconds: float) -> dict:
    """One layout's emulated step: ``step_seconds`` (from the end of the step before on
    every rank to the end of the last on every rank), ``tokens_per_s``, ``mfu`` (model
    FLOPs over the preset's bf16 dense peak), and on the rank that finished last:
    ``compute`` (its compute stream's busy seconds), ``comm`` (its communication stream's),
    ``exposed`` (the step less its compute: communication and waiting nothing hid),
    ``compute_by_op`` (its kernels' seconds by operation, launch waits left out: what a GPU
    profiler's table of kernels by name shows), ``spans`` (its timeline of the step) and
    ``bytes`` (by kind, every rank's summed)."""
    step = job_step(results)
    slowest = max(results, key=lambda r: r["ends"][-1])["last"]
    busy = sum(v for k, v in slowest["totals"].items() if k not in ("comm", "idle"))
    sent: dict = {}
    for r in results:
        for k, v in r["last"]["bytes"].items():
            sent[k] = sent.get(k, 0) + v
    cluster = emulate.preset(preset)
    tokens = batch_size * cfg.seq_len
    flops = model_flops_per_token(cfg.num_params(embeddings=False), cfg.n_layers, cfg.seq_len,
                                  cfg.d_model) * tokens
    return {"name": name, "dims": dims, "recipe": recipe, "world_size": dims.world_size,
            "step_seconds": step, "tokens_per_s": tokens / step,
            "mfu": flops / (step * dims.world_size * cluster.device.bf16_flops),
            "compute": busy, "comm": slowest["totals"].get("comm", 0.0),
            "exposed": max(step - busy, 0.0), "compute_by_op": slowest["by_op"],
            "spans": slowest["spans"], "bytes": sent,
            "time_kind": emulate.label(cluster) + " (dry run)",
            "peak": f"{cluster.device.name} bf16 dense, {cluster.device.bf16_flops / 1e12:g} "
                    "TFLOP/s", "wall_seconds": wall_seconds}


def same_clock_real_and_dry(cfg: GPTConfig, dims: ParallelDims, recipe: Recipe,
                            batch_size: int, preset="h100-node") -> dict:
    """Rank function for the tests: :func:`emulated_steps` on real tensors, then in the dry
    run; both clocks (``{False: ..., True: ...}``), which must be equal to the last bit."""
    out = {}
    for dry_run in (False, True):
        out[dry_run] = emulated_steps(cfg, dims, recipe, batch_size, 2, preset, dry_run)["clock"]
        dist.barrier()
    return out
