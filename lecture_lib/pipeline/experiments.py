"""What notebook 06 runs: training through a pipeline, recorded, and the fixed-cost mode.

* :func:`train_stage` (the rank function) trains this rank's stage of the
  small GPT and records every step (:class:`~.recorder.StepRecorder`);
  :func:`train` and :func:`train_many` start the ranks and :func:`merge`
  combines their results into a :class:`PipelineRun`.
* *Emulated time* (``preset="a100-node"``, :func:`measure_emulated_bubbles`):
  the stages compute for real while every operation and message is charged in
  the virtual time of the chosen GPUs and links (:mod:`lecture_lib.emulate`);
  :func:`bubble_report` reads a step against (p-1)/(m+p-1), against the
  unequal-stage closed form and against the simulator fed the step's own stage
  costs and message time.
* *Fixed-cost mode* (``cost=(t_forward, t_backward[, t_weight])`` in seconds
  per stage and micro-batch, :class:`FixedCostExecutor`): each action's
  compute is replaced by a wait of exactly its simulated cost
  (:func:`~.simulate.action_costs`), while activation- and gradient-shaped
  tensors still travel between the ranks as the schedule says. The measured
  timeline then shows the schedule itself even when 4 ranks share 2 cores (a
  sleeping rank takes no core from the others). ``cost=None`` trains.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..costmodel.pipeline import pipeline_bubble, pipeline_bubble_unequal, pipeline_step_time
from ..emulate import emulated
from ..emulate import preset as check_preset
from ..models import GPT, GPTConfig, MarkovText, TrainResult, make_optimizer
from ..progress import progress
from ..runtime import launch
from .actions import Schedule
from .execute import PipelineExecutor, exchange
from .recorder import StepRecord, StepRecorder, aligned, message_latency
from .schedules import make_schedule
from .simulate import action_costs, bubble_of, makespan_of, simulate
from .stage import check_pipeline, split_gpt

# ----------------------------------------------------------------------------
# Fixed-cost mode: the schedule's shape, free of how busy the CPU is
# ----------------------------------------------------------------------------


def nap_until(deadline: float, nap: float = 0.0005) -> None:
    """Sleep until ``deadline`` (a ``time.perf_counter()`` value) in short naps. One long
    ``time.sleep`` oversleeps by the wake-up latency of an idle CPU on every fixed-cost
    action (about 1.1 ms on the course's 2-core VM); short naps cut that to about 0.4 ms."""
    while (rest := deadline - time.perf_counter()) > 0:
        time.sleep(min(rest, nap))


def check_cost(cost) -> tuple[float, float, float] | None:
    if cost is None:
        return None
    cost = tuple(cost) + (0.0,) * (3 - len(tuple(cost)))
    if len(cost) != 3 or any(not isinstance(c, (int, float)) or c < 0 for c in cost):
        raise ValueError(f"cost must be (t_forward, t_backward[, t_weight]) in seconds >= 0, "
                         f"not {cost!r}")
    return cost


class FixedCostExecutor(PipelineExecutor):
    """The executor with every action's compute replaced by a wait of its cost.

    Receives and sends are the executor's own; what is sent is a tensor of
    zeros of the activation's shape. No loss is computed (``loss`` is None).
    """

    def __init__(self, chunks, schedule: Schedule, activation_shape: tuple, cost, **kwargs):
        super().__init__(chunks, schedule, activation_shape, **kwargs)
        self.costs = action_costs(schedule, *check_cost(cost))
        self.zeros = torch.zeros(self.shape, dtype=self.dtype, device=self.device)

    def forward(self, a, st) -> None:
        nap_until(time.perf_counter() + self.costs["F"])
        s = self.schedule.stage(self.stage, a.chunk)
        if s < self.last:
            self.send(self.zeros, s + 1, ("F", a.microbatch, s), st)

    def backward(self, a, st) -> None:
        nap_until(time.perf_counter() + self.costs["B"])
        s = self.schedule.stage(self.stage, a.chunk)
        if s > 0:
            self.send(self.zeros, s - 1, ("B", a.microbatch, s), st)

    def weight_gradient(self, a, st) -> None:
        nap_until(time.perf_counter() + self.costs["W"])


# ----------------------------------------------------------------------------
# Training with a pipeline: the rank function and the caller's entry point
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
    with emulated(preset) if preset is not None else nullcontext():
        executor = (PipelineExecutor(chunks, schedule, shape, **kwargs) if cost is None else
                    FixedCostExecutor(chunks, schedule, shape, cost, **kwargs))
        recorder = StepRecorder(activations=activations and cost is None)
        opt = make_optimizer([p for c in chunks for p in c.parameters()], optimizer, lr)
        data = MarkovText(cfg.vocab_size, cfg.seq_len, seed=data_seed)
        out = _train_steps(executor, recorder, opt, chunks, lambda s: data.batch(s, batch_size),
                           steps)
    return {**out, "params": {n: p.detach().cpu().clone() for c in chunks
                              for n, p in c.named_parameters()}}


def _train_steps(executor, recorder, opt, chunks, batch, steps: int) -> dict:
    """``steps`` optimizer steps through ``executor``: losses, records, first gradients."""
    losses, records, grads = [], [], {}
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        record = executor.step(x, y, recorder=recorder)
        if step == 0:
            grads = {n: p.grad.detach().cpu().clone() for c in chunks
                     for n, p in c.named_parameters() if p.grad is not None}
        opt.step()
        records.append(record)
        if record.loss is not None:
            losses.append(record.loss)
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
    losses = next((r["losses"] for r in results if r["losses"]), [])
    params = {k: v for r in results for k, v in r["params"].items()}
    grads = {k: v for r in results for k, v in r["grads"].items()}
    steps = len(results[0]["records"])
    per_step: list[list[StepRecord]] = [[r["records"][i] for r in results] for i in range(steps)]
    peaks = [max(rec.peak_activation_bytes for rec in r["records"]) for r in results]
    origin = results[0]["records"][0].clock[0] if steps else ""
    return PipelineRun(schedule, losses, params, grads, [aligned(rs) for rs in per_step], peaks,
                       [message_latency(schedule, rs) for rs in per_step],
                       origin if origin.startswith("emulated") else "real")


def _check_run(cfg: GPTConfig, schedules, batch_size: int, cost=None, layers=None,
               preset=None) -> None:
    """Every check of :func:`train` and :func:`train_many`, before any process starts."""
    for s in schedules:
        check_pipeline(cfg, s, batch_size, layers)
    check_cost(cost)
    if preset is not None:
        check_preset(preset)
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
# The bubble of real stages in emulated time
# ----------------------------------------------------------------------------

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


def measure_emulated_bubbles(cfg: GPTConfig, schedules: list[Schedule], microbatch_size: int, *,
                             layers=None, preset="a100-node", timeout: float = 300.0
                             ) -> list[dict]:
    """One emulated step of each schedule (``microbatch_size`` sequences per micro-batch,
    so the batch is ``m * microbatch_size``; SGD; all checked first), on the same warm
    ranks: :func:`bubble_report` of each, with its ``run``."""
    b = microbatch_size
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise ValueError(f"microbatch_size must be a whole number >= 1, not {microbatch_size!r}")
    if not schedules or len({s.num_stages for s in schedules}) != 1:
        raise ValueError("give one or more schedules, all with the same number of stages")
    for s in schedules:
        _check_run(cfg, [s], microbatch_size * s.microbatches, None, layers, preset)
    out, p = [], schedules[0].num_stages
    for s in progress(list(schedules), f"emulated pipeline: one schedule on {p} ranks each"):
        results = launch.run(train_stage, p, s, cfg, microbatch_size * s.microbatches, 1,
                             optimizer="sgd", lr=0.1, layers=layers, preset=preset,
                             activations=False, timeout=timeout)
        run = merge(s, results)
        out.append({**bubble_report(run), "run": run})
    return out
