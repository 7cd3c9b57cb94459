"""The data-parallel experiments notebook 02 and the tests run.

:class:`Trainer` is one rank's training step around any wrapper of
:mod:`lecture_lib.data_parallel.ddp` (or torch's DDP): shard the global
batch, accumulate micro-batches under ``no_sync()``, synchronise, step,
with compute, communication and optimizer time split by
:class:`lecture_lib.metrics.Timer`. :func:`train_data_parallel` trains one
variant and returns what :func:`lecture_lib.models.train_reference` returns,
so the result can be compared with one process; :func:`compare_variants`
times several configurations side by side, taking turns step by step.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ..metrics import Timer, wall_time
from ..models import TrainResult, make_optimizer, shard
from ..runtime import device
from .ddp import VARIANTS, check_bucket_size, wrap


def check_training_args(variant: str, steps: int, accumulation: int,
                        bucket_size_mb=None) -> None:
    """Clear errors for a bad configuration (call before any process starts)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    for name, value in (("steps", steps), ("accumulation", accumulation)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
    check_bucket_size(bucket_size_mb)


class Trainer:
    """One rank's data-parallel training: a wrapped model, its optimizer, a timer.

    ``trainer.step(batch)`` takes the *global* batch ``(x, y)``, trains on this
    rank's shard split into ``accumulation`` micro-batches (each loss divided by
    ``accumulation``; all but the last backward inside ``no_sync()``, unless
    ``sync_every_micro_batch``) and returns the local loss. ``trainer.timer``
    splits the time into "compute" (forward and backward, including launching
    async all-reduces), "comm" (waiting for the gradient synchronisation) and
    "optimizer".
    """

    def __init__(self, variant: str, model: nn.Module, lr: float = 1e-2,
                 optimizer: str = "adamw", accumulation: int = 1,
                 bucket_size_mb: float | None = None, sync_every_micro_batch: bool = False):
        check_training_args(variant, 1, accumulation, bucket_size_mb)
        self.device = device()
        self.model = model.to(self.device)
        self.ddp = wrap(variant, self.model, bucket_size_mb)
        self.opt = make_optimizer(self.model.parameters(), optimizer, lr)
        self.accumulation, self.every = accumulation, sync_every_micro_batch
        self.timer = Timer(self.device)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def step(self, batch) -> torch.Tensor:
        x, y = shard(batch, self.rank, self.world)
        if x.shape[0] % self.accumulation:
            raise ValueError(f"a shard of {x.shape[0]} samples does not split into "
                             f"{self.accumulation} micro-batches")
        ddp, timer = self.ddp, self.timer
        ddp.on_train_batch_start()
        self.opt.zero_grad(set_to_none=True)
        micro = list(zip(x.to(self.device).chunk(self.accumulation),
                         y.to(self.device).chunk(self.accumulation)))
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, (mx, my) in enumerate(micro):
            last = i == len(micro) - 1
            with timer("compute"):
                if last or self.every:
                    loss = ddp(mx, my) / self.accumulation
                    loss.backward()
                else:
                    with ddp.no_sync():
                        loss = ddp(mx, my) / self.accumulation
                        loss.backward()
            if self.every and not last:
                with timer("comm"):
                    ddp.finish_gradient_synchronization()
            total += loss.detach().double()
        with timer("comm"):
            ddp.finish_gradient_synchronization()
        with timer("optimizer"):
            self.opt.step()
        return total


def train_data_parallel(variant: str, model: nn.Module, batches, steps: int, lr: float = 1e-2,
                        optimizer: str = "adamw", accumulation: int = 1,
                        bucket_size_mb: float | None = None,
                        sync_every_micro_batch: bool = False) -> TrainResult:
    """Train ``model`` data-parallel on this rank; call on every rank of the default group.

    ``batches(step) -> (x, y)`` gives the *global* batch (see :class:`Trainer`).
    Returns the loss of the whole global batch per step and the final
    parameters, comparable with :func:`lecture_lib.models.train_reference`.
    """
    check_training_args(variant, steps, accumulation, bucket_size_mb)
    trainer = Trainer(variant, model, lr, optimizer, accumulation, bucket_size_mb,
                      sync_every_micro_batch)
    losses = torch.stack([trainer.step(batches(step)) for step in range(steps)])
    dist.all_reduce(losses)                      # the loss of the global batch, for the record
    losses /= trainer.world
    return TrainResult(losses.tolist(),
                       {k: v.detach().cpu().clone() for k, v in model.named_parameters()})


def compare_variants(configs: dict, model_fn, batches, steps: int, warmup: int = 1,
                     lr: float = 1e-2, optimizer: str = "adamw", accumulation: int = 1) -> dict:
    """Time several data-parallel configurations side by side on this rank.

    ``configs[name] = dict(variant=..., bucket_size_mb=..., sync_every_micro_batch=...)``;
    ``model_fn()`` builds a fresh model. The configurations take turns, one step
    each, so a slow spell of a shared machine hits all of them alike. After
    ``warmup`` untimed rounds, returns per name: ``step_times`` (s, each the
    slowest rank's), ``totals`` (this rank's seconds per phase, summed over the
    timed steps), ``spans`` (this rank's phases in the last step, from its start),
    ``buckets`` (bucketed only) and ``model_bytes``.
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a whole number >= 0, not {warmup!r}")
    trainers = {}
    for name, cfg in configs.items():
        unknown = set(cfg) - {"variant", "bucket_size_mb", "sync_every_micro_batch",
                              "accumulation"}
        if unknown:
            raise ValueError(f"config {name!r}: unknown keys {sorted(unknown)}")
        check_training_args(cfg["variant"], steps, cfg.get("accumulation", accumulation),
                            cfg.get("bucket_size_mb"))
        trainers[name] = Trainer(cfg["variant"], model_fn(), lr, optimizer,
                                 cfg.get("accumulation", accumulation), cfg.get("bucket_size_mb"),
                                 cfg.get("sync_every_micro_batch", False))
    dev = device()
    out = {name: {"step_times": [], "spans": []} for name in configs}
    for step in range(warmup + steps):
        batch = batches(step)
        for name, trainer in trainers.items():
            if step == warmup:
                trainer.timer.reset()
            dist.barrier()
            first_span = len(trainer.timer.spans)
            with wall_time(dev) as t:
                trainer.step(batch)
            if step >= warmup:
                slowest = torch.tensor([t.seconds], dtype=torch.float64, device=dev)
                dist.all_reduce(slowest, dist.ReduceOp.MAX)
                out[name]["step_times"].append(slowest.item())
                spans = trainer.timer.spans[first_span:]
                t0 = spans[0][1]
                out[name]["spans"] = [(k, a - t0, b - t0) for k, a, b in spans]
    for name, trainer in trainers.items():
        out[name]["totals"] = dict(trainer.timer.totals)
        out[name]["buckets"] = len(getattr(trainer.ddp, "buckets", []))
        out[name]["model_bytes"] = sum(p.numel() * p.element_size()
                                       for p in trainer.model.parameters() if p.requires_grad)
    return out
