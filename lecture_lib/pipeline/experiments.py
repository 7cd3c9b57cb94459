"""What notebook 06 runs: training through a pipeline, recorded, and the fixed-cost mode.

* :func:`train_stage` (the rank function) trains this rank's stage of the
  small GPT and records every step (:class:`~.recorder.StepRecorder`);
  :func:`train` and :func:`train_many` start the ranks and :func:`merge`
  combines their results into a :class:`PipelineRun`.
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
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import launch
from ..models import GPT, GPTConfig, MarkovText, TrainResult, make_optimizer
from ..progress import progress
from .actions import Schedule
from .execute import PipelineExecutor, exchange
from .recorder import StepRecord, StepRecorder, aligned, message_latency
from .schedules import make_schedule
from .simulate import action_costs
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
                activations: bool = True) -> dict:
    """On each rank of the pipeline: train its stage for ``steps`` steps of MarkovText.

    Returns ``losses`` (last stage; else empty), this rank's ``params`` after
    training and ``grads`` of the first step (by full-model name), and the
    :class:`StepRecord` of every step (``activations``: count saved bytes too).
    """
    check_pipeline(cfg, schedule, batch_size)
    gpt = GPT(cfg, seed).to(launch.device())
    parts = split_gpt(gpt, schedule.num_stages, schedule.chunks)
    stage_ranks = (list(ranks) if ranks is not None else
                   dist.get_process_group_ranks(group) if group is not None else
                   list(range(dist.get_world_size())))
    chunks = [parts[schedule.stage(stage_ranks.index(dist.get_rank()), c)]
              for c in range(schedule.chunks)]
    shape = (batch_size // schedule.num_microbatches, cfg.seq_len, cfg.d_model)
    kwargs = dict(ranks=stage_ranks, group=group, exchange=exchange)
    executor = (PipelineExecutor(chunks, schedule, shape, **kwargs) if cost is None else
                FixedCostExecutor(chunks, schedule, shape, cost, **kwargs))
    recorder = StepRecorder(activations=activations and cost is None)
    opt = make_optimizer([p for c in chunks for p in c.parameters()], optimizer, lr)
    data = MarkovText(cfg.vocab_size, cfg.seq_len, seed=data_seed)
    losses, records, grads = [], [], {}
    for step in range(steps):
        x, y = data.batch(step, batch_size)
        opt.zero_grad(set_to_none=True)
        record = executor.step(x, y, recorder=recorder)
        if step == 0:
            grads = {n: p.grad.detach().cpu().clone() for c in chunks
                     for n, p in c.named_parameters() if p.grad is not None}
        opt.step()
        records.append(record)
        if record.loss is not None:
            losses.append(record.loss)
    return {"losses": losses, "records": records, "grads": grads,
            "params": {n: p.detach().cpu().clone() for c in chunks
                       for n, p in c.named_parameters()}}


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
    return PipelineRun(schedule, losses, params, grads, [aligned(rs) for rs in per_step], peaks,
                       [message_latency(schedule, rs) for rs in per_step])


def train(cfg: GPTConfig, schedule: Schedule | str, num_stages: int | None = None,
          num_microbatches: int | None = None, *, batch_size: int, steps: int = 1,
          chunks: int = 1, lr: float = 1e-2, optimizer: str = "adamw", seed: int = 0,
          data_seed: int = 0, cost=None, timeout: float = 120.0) -> PipelineRun:
    """Train the GPT with a pipeline on ``num_stages`` fresh ranks (checked first).

    >>> run = train(GPTConfig(n_layers=4), "1f1b", 2, 4, batch_size=8, steps=2)
    >>> run.losses, run.timelines[-1][0][:2]
    """
    if isinstance(schedule, str):
        schedule = make_schedule(schedule, num_stages, num_microbatches, chunks)
    check_pipeline(cfg, schedule, batch_size)
    check_cost(cost)
    results = launch.run(train_stage, schedule.num_stages, schedule, cfg, batch_size, steps,
                         lr=lr, optimizer=optimizer, seed=seed, data_seed=data_seed, cost=cost,
                         timeout=timeout)
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
    for s in schedules:
        check_pipeline(cfg, s, batch_size)
    check_cost(kwargs.get("cost"))
    depth = depths.pop()
    return [merge(s, launch.run(train_stage, depth, s, cfg, batch_size, steps, timeout=timeout,
                                **kwargs))
            for s in progress(list(schedules), f"pipeline: one schedule on {depth} ranks each")]
