"""What notebook 06 runs: training through a pipeline, and its bubble in emulated time.

* :func:`train_stage` (the rank function) trains this rank's stage of the small GPT and
  records every step (:class:`~.recorder.StepRecorder`); :func:`train` and
  :func:`train_many` start the ranks, :func:`merge` combines their results into a
  :class:`PipelineRun`. ``cost=(t_forward, t_backward[, t_weight])`` runs the fixed-cost
  mode instead (:mod:`.fixed_cost`).
* :func:`time_step` (the rank function of emulated time) builds a GPT and times one step
  of it, never reading a value, so the same code runs on real tensors and in the dry run
  (fake tensors, :func:`lecture_lib.emulate.run`): :func:`measure_emulated_bubbles` on the
  small GPT, :func:`time_at_scale` on a model of real size (``models.REAL_SIZE``).
  :func:`bubble_report` reads a step against (pp-1)/(m+pp-1), the unequal-stage closed
  form and the simulator fed the step's own stage costs and message time.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import emulate
from ..costmodel.pipeline import pipeline_bubble, pipeline_bubble_unequal, pipeline_step_time
from ..models import GPT, GPTConfig, MarkovText, TrainResult, make_optimizer, real_size
from ..progress import progress
from ..runtime import launch
from .actions import Schedule
from .execute import PipelineExecutor, exchange
from .fixed_cost import FixedCostExecutor, check_cost
from .recorder import StepRecord, StepRecorder, aligned, message_latency
from .schedules import make_schedule
from .simulate import bubble_of, busy_time, makespan_of, simulate
from .stage import check_pipeline, split_gpt

# ----------------------------------------------------------------------------
# Training with a pipeline: the rank function and the caller's entry points
# ----------------------------------------------------------------------------


def train_stage(schedule: Schedule, cfg: GPTConfig, batch_size: int, steps: int = 1, *,
                lr: float = 1e-2, optimizer: str = "adamw", seed: int = 0, data_seed: int = 0,
                cost=None, ranks=None, group=None, exchange=exchange,
                activations: bool = True, layers=None, preset=None) -> dict:
    """On each rank of the pipeline: train its stage for ``steps`` steps of MarkovText.

    Returns ``losses`` (last stage; else empty), this rank's ``params`` after
    training and ``grads`` of the first step (by full-model name), and the
    :class:`StepRecord` of every step (``activations``: count saved bytes too).
    ``layers`` splits the blocks unequally (:func:`~.stage.split_gpt`); with
    ``preset`` (e.g. ``"a100-node"``) the training steps are emulated
    (:func:`lecture_lib.emulate.emulated`; the model is built before, untimed) and
    the records are in emulated seconds.
    """
    check_pipeline(cfg, schedule, batch_size, layers)
    gpt = GPT(cfg, seed).to(launch.device())      # the whole model on every rank: not timed
    parts = split_gpt(gpt, schedule.num_stages, schedule.chunks, layers)
    stage_ranks = (list(ranks) if ranks is not None else
                   dist.get_process_group_ranks(group) if group is not None else
                   list(range(dist.get_world_size())))
    chunks = [parts[schedule.stage(stage_ranks.index(dist.get_rank()), c)]
              for c in range(schedule.chunks)]
    shape = (batch_size // schedule.microbatches, cfg.seq_len, cfg.d_model)
    kwargs = dict(ranks=stage_ranks, group=group, exchange=exchange)
    with emulate.emulated(preset) if preset is not None else nullcontext():
        executor = (PipelineExecutor(chunks, schedule, shape, **kwargs) if cost is None else
                    FixedCostExecutor(chunks, schedule, shape, cost, **kwargs))
        recorder = StepRecorder(activations=activations and cost is None)
        opt = make_optimizer([p for c in chunks for p in c.parameters()], optimizer, lr)
        data = MarkovText(cfg.vocab_size, cfg.seq_len, seed=data_seed)
        out = _train_steps(executor, recorder, opt, lambda s: data.batch(s, batch_size), steps)
    return {**out, "params": {n: p.detach().cpu().clone() for c in chunks
                              for n, p in c.named_parameters()}}


def _train_steps(executor, recorder, opt, batch, steps: int) -> dict:
    """``steps`` optimizer steps through ``executor``: losses, records, first gradients."""
    losses, records, grads = [], [], {}
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        with recorder.watching(executor):
            loss = executor.step(x, y)
        if step == 0:
            grads = {n: p.grad.detach().cpu().clone() for c in executor.chunks
                     for n, p in c.named_parameters() if p.grad is not None}
        opt.step()
        recorder.record.loss = None if loss is None else loss.item()
        records.append(recorder.record)
        if loss is not None:
            losses.append(recorder.record.loss)
    return {"losses": losses, "records": records, "grads": grads}


@dataclass
class PipelineRun:
    """The merged results of every rank (see :func:`train`)."""
    schedule: Schedule
    losses: list[float]
    params: dict
    grads: dict
    timelines: list                 # per step: {rank: [(kind, start, end, label), ...]}
    peak_activation_bytes: list     # per rank, the largest over steps
    latencies: list = field(default_factory=list)   # per step: mean message delay (s)
    time_kind: str = "real"         # or e.g. "emulated H100 + NVLink" (train's ``preset``)

    def as_train_result(self) -> TrainResult:
        return TrainResult(self.losses, self.params)


def merge(schedule: Schedule, results: list[dict]) -> PipelineRun:
    """Combine the per-rank dicts of :func:`train_stage` (in stage order)."""
    steps = len(results[0]["records"])
    per_step: list[list[StepRecord]] = [[r["records"][i] for r in results] for i in range(steps)]
    origin = results[0]["records"][0].clock[0] if steps else ""
    return PipelineRun(
        schedule, next((r["losses"] for r in results if r["losses"]), []),
        {k: v for r in results for k, v in r["params"].items()},
        {k: v for r in results for k, v in r["grads"].items()},
        [aligned(rs) for rs in per_step],
        [max(rec.peak_activation_bytes for rec in r["records"]) for r in results],
        [message_latency(schedule, rs) for rs in per_step],
        origin if origin.startswith("emulated") else "real")


def _check_run(cfg: GPTConfig, schedules, batch_size: int, cost=None, layers=None,
               preset=None) -> None:
    """Every check of :func:`train` and :func:`train_many`, before any process starts."""
    for s in schedules:
        check_pipeline(cfg, s, batch_size, layers)
    check_cost(cost)
    if preset is not None:
        emulate.preset(preset)
        if cost is not None:
            raise ValueError("the fixed-cost mode (cost=...) waits in real time: it cannot be "
                             "emulated (preset=...); use one or the other")


def train(cfg: GPTConfig, schedule: Schedule | str, num_stages: int | None = None,
          microbatches: int | None = None, *, batch_size: int, steps: int = 1,
          chunks: int = 1, lr: float = 1e-2, optimizer: str = "adamw", seed: int = 0,
          data_seed: int = 0, cost=None, layers=None, preset=None,
          timeout: float = 120.0) -> PipelineRun:
    """Train the GPT with a pipeline on ``num_stages`` fresh ranks (checked first);
    ``layers`` and ``preset`` as in :func:`train_stage`.

    >>> run = train(GPTConfig(n_layers=4), "1f1b", 2, 4, batch_size=8, steps=2)
    >>> run.losses, run.timelines[-1][0][:2]
    """
    if isinstance(schedule, str):
        schedule = make_schedule(schedule, num_stages, microbatches, chunks)
    _check_run(cfg, [schedule], batch_size, cost, layers, preset)
    results = launch.run(train_stage, schedule.num_stages, schedule, cfg, batch_size, steps,
                         lr=lr, optimizer=optimizer, seed=seed, data_seed=data_seed, cost=cost,
                         layers=layers, preset=preset, timeout=timeout)
    return merge(schedule, results)


def train_many(cfg: GPTConfig, schedules: list[Schedule], *, batch_size: int, steps: int = 1,
               timeout: float = 180.0, **kwargs) -> list[PipelineRun]:
    """:func:`train` for several schedules of one pipeline depth, all checked first, then
    one warm call of the same ranks per schedule (milliseconds each; a cold start of 4
    ranks costs seconds), with :func:`~lecture_lib.progress.progress`. ``timeout`` is
    each call's."""
    if not schedules:
        raise ValueError("no schedules given")
    depths = {s.num_stages for s in schedules}
    if len(depths) != 1:
        raise ValueError(f"every schedule must have the same number of stages, not {depths}")
    _check_run(cfg, schedules, batch_size, kwargs.get("cost"), kwargs.get("layers"),
               kwargs.get("preset"))
    depth = depths.pop()
    return [merge(s, launch.run(train_stage, depth, s, cfg, batch_size, steps, timeout=timeout,
                                **kwargs))
            for s in progress(list(schedules), f"pipeline: one schedule on {depth} ranks each")]


# ----------------------------------------------------------------------------
# One step in emulated time: real tensors on the small GPT, fake ones at real size
# ----------------------------------------------------------------------------

def time_step(schedule: Schedule, cfg: GPTConfig, microbatch_size: int, *, layers=None,
              activations: bool = False, dtype=torch.float32, seed: int = 0) -> StepRecord:
    """Rank function, under the emulation (real or dry run, :func:`lecture_lib.emulate.run`):
    one recorded step of ``schedule`` on a GPT built here (fake in a dry run), on random
    tokens. Nothing reads a value: no ``.item()``, no branch on a tensor."""
    m, b = schedule.microbatches, microbatch_size
    gpt = GPT(cfg, seed).to(device=launch.device(), dtype=dtype)
    parts = split_gpt(gpt, schedule.num_stages, schedule.chunks, layers)
    chunks = [parts[schedule.stage(dist.get_rank(), c)] for c in range(schedule.chunks)]
    executor = PipelineExecutor(chunks, schedule, (b, cfg.seq_len, cfg.d_model), dtype=dtype)
    tokens = torch.randint(cfg.vocab_size, (m * b, cfg.seq_len + 1),
                           generator=torch.Generator().manual_seed(seed))
    recorder = StepRecorder(activations)
    with recorder.watching(executor):
        executor.step(tokens[:, :-1], tokens[:, 1:])
    return recorder.record


def _emulated_runs(cfg: GPTConfig, schedules: list, microbatch_size: int, *, preset,
                   dry_run: bool, timeout: float, **kwargs) -> list[dict]:
    """:func:`time_step` of each schedule on its ranks (checked first): :func:`bubble_report`
    of each, with its ``run``, the bytes each rank sent and the wall time it took."""
    if (isinstance(microbatch_size, bool) or not isinstance(microbatch_size, int)
            or microbatch_size < 1):
        raise ValueError(f"microbatch_size must be a whole number >= 1, not {microbatch_size!r}")
    if not schedules:
        raise ValueError("give one or more schedules")
    for s in schedules:
        _check_run(cfg, [s], microbatch_size * s.microbatches, None, kwargs.get("layers"),
                   preset)
    out = []
    for s in progress(list(schedules), f"emulated pipeline ({'dry run' if dry_run else 'real'})"):
        start = time.perf_counter()
        results = emulate.run(time_step, s.num_stages, s, cfg, microbatch_size, preset=preset,
                              dry_run=dry_run, timeout=timeout, **kwargs)
        records = [r.result for r in results]
        run = PipelineRun(s, [], {}, {}, [aligned(records)],
                          [rec.peak_activation_bytes for rec in records],
                          [message_latency(s, records)], records[0].clock[0])
        out.append({**bubble_report(run), "run": run, "wall_s": time.perf_counter() - start,
                    "sent_bytes": [r.clock.bytes_by_kind.get("send", 0) for r in results]})
    return out


def measure_emulated_bubbles(cfg: GPTConfig, schedules: list[Schedule], microbatch_size: int, *,
                             layers=None, preset="a100-node", timeout: float = 300.0
                             ) -> list[dict]:
    """One emulated step of each schedule on real tensors of ``cfg`` (``microbatch_size``
    sequences per micro-batch, so the batch is ``m * microbatch_size``):
    :func:`bubble_report` of each, with its ``run``."""
    return _emulated_runs(cfg, schedules, microbatch_size, preset=preset, dry_run=False,
                          timeout=timeout, layers=layers)


def time_at_scale(schedules: list[Schedule], model: str = "GPT-3 175B",
                  layers_per_stage: int = 2, microbatch_size: int = 1, *, layers=None,
                  preset="h100-node", activations: bool = True, dtype=torch.bfloat16,
                  timeout: float = 300.0) -> list[dict]:
    """One step of each schedule on ``model`` (a name of ``models.REAL_SIZE``) with
    ``layers_per_stage`` of its layers on every rank (or ``layers``: the blocks of each
    virtual stage, e.g. one fewer on the stage that holds the head), in the dry run
    (nothing computed; bf16 weights, activations and messages). Each is
    :func:`bubble_report` plus: ``model``, ``n_layers``, ``tokens`` per micro-batch,
    ``preset``, ``peak_activation_bytes`` and ``sent_bytes`` per rank, ``compute_s``
    (busy) and ``idle_s`` per rank, ``wall_s`` (this machine's seconds)."""
    out = []
    for s in schedules:
        if layers is None and layers_per_stage % s.chunks:
            raise ValueError(f"{s.name}: {layers_per_stage} layers per stage do not split into "
                             f"{s.chunks} chunks")
        n_layers = sum(layers) if layers is not None else layers_per_stage * s.num_stages
        cfg = real_size(model, n_layers=n_layers)
        (rep,) = _emulated_runs(cfg, [s], microbatch_size, preset=preset, dry_run=True,
                                timeout=timeout, layers=layers, activations=activations,
                                dtype=dtype)
        timeline = rep["run"].timelines[0]
        busy = [busy_time(timeline[r]) for r in range(s.num_stages)]
        out.append({**rep, "model": model, "n_layers": n_layers, "preset": preset,
                    "tokens": microbatch_size * cfg.seq_len,
                    "peak_activation_bytes": rep["run"].peak_activation_bytes,
                    "compute_s": busy, "idle_s": [rep["step_s"] - t for t in busy]})
    return out


def bubble_report(run: PipelineRun, step: int = -1) -> dict:
    """One step's bubble against theory: ``bubble`` measured; ``theory``
    (p-1)/(v m+p-1); the step's own per-stage costs (``forward``, ``backward``,
    ``weight``, ``stage_times``: seconds per micro-batch) and ``message_s``
    (:func:`~.recorder.message_latency`); ``simulated``, the simulator given both;
    for one chunk per rank, ``formula_step_s`` and ``formula_bubble`` of the
    unequal-stage closed form (no message time)."""
    s, timeline = run.schedule, run.timelines[step]
    m, p = s.microbatches, s.num_stages
    per = {k: [sum(e - b for kind, b, e, _ in timeline[r] if kind == k) / m for r in range(p)]
           for k in "FBW"}
    times = [f + b + w for f, b, w in zip(per["F"], per["B"], per["W"])]
    out = {"schedule": s.name, "m": m, "chunks": s.chunks, "bubble": bubble_of(timeline),
           "theory": pipeline_bubble(p, m, s.chunks), "step_s": makespan_of(timeline),
           "forward": per["F"], "backward": per["B"], "weight": per["W"], "stage_times": times,
           "message_s": run.latencies[step],
           "simulated": simulate(s, per["F"], per["B"], per["W"],
                                 latency=run.latencies[step]).bubble_fraction}
    if s.chunks == 1 and not s.split_backward:
        out.update(formula_step_s=pipeline_step_time(times, m),
                   formula_bubble=pipeline_bubble_unequal(times, m))
    return out
