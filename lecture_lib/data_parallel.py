"""Data parallelism: every rank holds the whole model and a shard of the batch.

The idea (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating
Data Parallel Training", VLDB; the lecture's five steps):

1. **replicate**: every rank starts from the same parameters (rank 0's are
   broadcast at construction, buffers too);
2. **shard the data**: rank ``r`` takes its slice of the global batch;
3. **local gradients**: forward and backward on the slice;
4. **average**: all-reduce the gradients and divide by the number of ranks,
   so every rank holds the gradient of the *whole* batch;
5. **update**: every rank takes the same optimizer step, so the replicas stay equal.

Step 4 is the communication, and where it happens is what the variants here
differ in:

* :class:`DDPNaive`: after backward, one blocking all-reduce per parameter
  (many small messages, nothing overlapped);
* :class:`DDPFlat`: after backward, one all-reduce of all gradients flattened
  into one buffer (one large message, nothing overlapped);
* :class:`DDPIndividualParameters`: an asynchronous all-reduce per parameter,
  launched from the parameter's post-accumulate-grad hook *during* backward,
  so communication overlaps the rest of backward;
* :class:`DDPBucketed`: gradients grouped into buckets of about
  ``bucket_size_mb`` in reverse parameter order (the order backward produces
  them) and one asynchronous all-reduce per bucket as soon as it is full
  (torch's DistributedDataParallel does this, with 25 MB buckets).

The interface is Stanford CS336 assignment 2's: ``ddp = DDPBucketed(model,
bucket_size_mb)``; ``ddp(x)``; ``loss.backward()``;
``ddp.finish_gradient_synchronization()``; ``optimizer.step()``. Every
wrapper exposes ``.module``, skips frozen parameters (broadcast, never
reduced), handles tied weights (one parameter object, reduced once) and
offers ``no_sync()`` for gradient accumulation: backward passes inside it
only accumulate local gradients; the next backward outside it synchronises
the accumulated sum.

:func:`train_data_parallel` is the training loop the tests and notebook 02
share: it trains any variant (or torch's DDP) on a rank, timing compute and
communication with :class:`lecture_lib.metrics.Timer`.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn

from .launch import device
from .metrics import Timer, wall_time
from .models import TrainResult, make_optimizer, shard

VARIANTS = ("naive", "flat", "individual", "bucketed", "torch")


class _DataParallel(nn.Module):
    """What every variant shares: replicate at construction, forward, ``no_sync``."""

    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, not {type(module).__name__}")
        if not dist.is_initialized():
            raise RuntimeError("no process group: wrap the model inside lecture_lib.run(...) "
                               "or torchrun")
        if dist.get_rank(group) < 0:
            raise ValueError(f"global rank {dist.get_rank()} is not a member of the group "
                             f"{dist.get_process_group_ranks(group)}")
        dev = device()
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if t.device != dev:
                raise ValueError(f"{name} is on {t.device} but this rank's device is {dev} "
                                 "(move the model with .to(lecture_lib.device()) first)")
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self._sync = True
        src = dist.get_global_rank(group, 0) if group is not None else 0
        with torch.no_grad():                        # step 1: replicate rank 0's state
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src, group=group)
        # parameters() yields a tied parameter once: it is reduced once
        self.params = [p for p in module.parameters() if p.requires_grad]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Backward passes in this block accumulate local gradients without communicating."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def on_train_batch_start(self) -> None:
        """Called before each step (CS336's interface); nothing to do here."""

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError


class DDPNaive(_DataParallel):
    """After backward: one blocking all-reduce per parameter, then divide."""

    def finish_gradient_synchronization(self) -> None:
        if not self._sync:
            return
        for p in self.params:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.group)
                p.grad.div_(self.world_size)


class DDPFlat(_DataParallel):
    """After backward: flatten every gradient into one buffer, one all-reduce, copy back."""

    def finish_gradient_synchronization(self) -> None:
        if not self._sync:
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads]).div_(self.world_size)
        dist.all_reduce(flat, group=self.group)
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))


class DDPIndividualParameters(_DataParallel):
    """An async all-reduce per parameter, launched by its post-accumulate-grad hook."""

    def __init__(self, module: nn.Module, group=None):
        super().__init__(module, group)
        self._handles = []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, p: torch.Tensor) -> None:
        if self._sync:
            p.grad.div_(self.world_size)             # sum of grad / p = the average
            self._handles.append(dist.all_reduce(p.grad, group=self.group, async_op=True))

    def finish_gradient_synchronization(self) -> None:
        for handle in self._handles:
            handle.wait()
        self._handles.clear()


def _check_bucket_size(bucket_size_mb) -> None:
    if bucket_size_mb is None:
        return
    if isinstance(bucket_size_mb, bool) or not isinstance(bucket_size_mb, (int, float)):
        raise TypeError(f"bucket_size_mb must be a number of MB or None, "
                        f"not {type(bucket_size_mb).__name__}")
    if not bucket_size_mb > 0:
        raise ValueError(f"bucket_size_mb must be > 0 (or None for one bucket), "
                         f"not {bucket_size_mb}")


def make_buckets(params, bucket_size_mb: float | None) -> list[list[torch.Tensor]]:
    """Group ``params`` in reverse order into buckets of at most ``bucket_size_mb`` MB
    (2**20 bytes); a parameter larger than that gets a bucket of its own; None: one bucket."""
    _check_bucket_size(bucket_size_mb)
    params = list(params)[::-1]
    if bucket_size_mb is None:
        return [params] if params else []
    limit = bucket_size_mb * 2**20
    buckets, current, used = [], [], 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if current and used + nbytes > limit:
            buckets.append(current)
            current, used = [], 0
        current.append(p)
        used += nbytes
    if current:
        buckets.append(current)
    return buckets


class DDPBucketed(_DataParallel):
    """An async all-reduce per bucket of gradients, launched as soon as the bucket is full.

    Buckets are launched in index order on every rank (a bucket that fills
    early waits for the ones before it), so all ranks issue their collectives
    in the same order, as torch's DDP does.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float | None, group=None):
        _check_bucket_size(bucket_size_mb)
        super().__init__(module, group)
        self.bucket_size_mb = bucket_size_mb
        self.buckets = make_buckets(self.params, bucket_size_mb)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._ready = [0] * len(self.buckets)
        self._launched: list[tuple[int, torch.Tensor, object]] = []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self._sync:
            return
        self._ready[self._bucket_of[id(p)]] += 1
        while (len(self._launched) < len(self.buckets)
               and self._ready[len(self._launched)] == len(self.buckets[len(self._launched)])):
            self._launch(len(self._launched))

    def _launch(self, index: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[index]]
        flat = torch.cat([g.reshape(-1) for g in grads]).div_(self.world_size)
        handle = dist.all_reduce(flat, group=self.group, async_op=True)
        self._launched.append((index, flat, handle))

    def on_train_batch_start(self) -> None:
        self._ready = [0] * len(self.buckets)

    def finish_gradient_synchronization(self) -> None:
        if not self._sync:
            return
        if len(self._launched) < len(self.buckets) and any(self._ready):
            for index in range(len(self._launched), len(self.buckets)):  # unused parameters
                self._launch(index)
        for index, flat, handle in self._launched:
            handle.wait()
            params = self.buckets[index]
            for p, part in zip(params, flat.split([p.numel() for p in params])):
                if p.grad is None:
                    p.grad = part.view_as(p).clone()
                else:
                    p.grad.copy_(part.view_as(p))
        self._launched.clear()
        self._ready = [0] * len(self.buckets)


class _TorchDDP(nn.Module):
    """torch's DistributedDataParallel behind the same interface (the baseline)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25, group=None):
        super().__init__()
        _check_bucket_size(bucket_size_mb)
        dev = device()
        self.ddp = nn.parallel.DistributedDataParallel(
            module, device_ids=[dev] if dev.type == "cuda" else None, process_group=group,
            bucket_cap_mb=bucket_size_mb if bucket_size_mb is not None else 1e6)
        self.module = module

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def no_sync(self):
        return self.ddp.no_sync()

    def on_train_batch_start(self) -> None:
        pass

    def finish_gradient_synchronization(self) -> None:
        pass                                # torch's DDP has finished inside backward


def wrap(variant: str, module: nn.Module, bucket_size_mb: float | None = None, group=None):
    """The data-parallel wrapper named ``variant`` (one of :data:`VARIANTS`)."""
    if variant == "naive":
        return DDPNaive(module, group)
    if variant == "flat":
        return DDPFlat(module, group)
    if variant == "individual":
        return DDPIndividualParameters(module, group)
    if variant == "bucketed":
        return DDPBucketed(module, bucket_size_mb, group)
    if variant == "torch":
        return _TorchDDP(module, 25 if bucket_size_mb is None else bucket_size_mb, group)
    raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")


def check_training_args(variant: str, steps: int, accumulation: int,
                        bucket_size_mb=None) -> None:
    """Clear errors for a bad configuration (call before any process starts)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    for name, value in (("steps", steps), ("accumulation", accumulation)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
    _check_bucket_size(bucket_size_mb)


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
