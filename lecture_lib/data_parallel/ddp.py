"""Data parallelism: every rank holds the whole model and a shard of the batch.

Li et al. 2020 ("PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB), in the lecture's five steps::

    rank 0:  same parameters, batch shard x_0 -> gradients g_0 -.
    rank 1:  same parameters, batch shard x_1 -> gradients g_1 --+- all-reduce / p:
    ...                                                          |  every rank holds
    rank p-1:                 batch shard x_p-1 -> g_p-1 --------'  the whole batch's mean

1. **replicate**: rank 0's parameters and buffers are broadcast at construction;
2. **shard the data**: rank ``r`` takes its slice of the global batch;
3. **local gradients**: forward and backward on the slice;
4. **average**: all-reduce the gradients and divide by ``p``;
5. **update**: every rank takes the same optimizer step, so the replicas stay equal.

Step 4 is the communication, and when it happens is what the variants differ in::

    DDPNaive                 after backward: one blocking all-reduce per parameter
    DDPFlat                  after backward: one all-reduce of every gradient in one buffer
    DDPIndividualParameters  during backward: an async all-reduce per parameter, from its hook
    DDPBucketed              during backward: an async all-reduce per bucket of ~bucket_size_mb
                             (torch's DistributedDataParallel, with 25 MB buckets)

The interface is Stanford CS336 assignment 2's: ``ddp = DDPBucketed(model,
bucket_size_mb)``; ``ddp(x)``; ``loss.backward()``;
``ddp.finish_gradient_synchronization()``; ``optimizer.step()``. Every
wrapper exposes ``.module``, skips frozen parameters (broadcast, never
reduced), reduces a tied weight once, and offers ``no_sync()`` for gradient
accumulation: backward passes inside it only accumulate local gradients; the
next backward outside it synchronises the accumulated sum. Every all-reduce
runs through :mod:`lecture_lib.comm` (a ``"comm"`` span whoever watches sees);
training and timing them is :mod:`.experiments`' and :mod:`.emulated`'s.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn

from ..comm import all_reduce_flat, collective, group_info
from ..runtime import device

VARIANTS = ("naive", "flat", "individual", "bucketed", "torch")


class _DataParallel(nn.Module):
    """What every variant shares: replicate at construction, forward, ``no_sync``."""

    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, not {type(module).__name__}")
        rank, self.world_size = group_info(group, required=True)
        if rank < 0:
            raise ValueError(f"global rank {dist.get_rank()} is not a member of the group "
                             f"{dist.get_process_group_ranks(group)}")
        dev = device()
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if t.device != dev:
                raise ValueError(f"{name} is on {t.device} but this rank's device is {dev} "
                                 "(move the model with .to(lecture_lib.device()) first)")
        self.module = module
        self.group = group
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

    def _all_reduce_one(self, grad: torch.Tensor, async_op: bool = False):
        """All-reduce one gradient in place (recorded when a recorder is on)."""
        with collective("all_reduce", grad.numel() * grad.element_size(), self.world_size,
                        "grads", grad.device):
            return dist.all_reduce(grad, group=self.group, async_op=async_op)


class DDPNaive(_DataParallel):
    """After backward: one blocking all-reduce per parameter, then divide."""

    def finish_gradient_synchronization(self) -> None:
        if not self._sync:
            return
        for p in self.params:
            if p.grad is not None:
                self._all_reduce_one(p.grad)
                p.grad.div_(self.world_size)


class DDPFlat(_DataParallel):
    """After backward: every gradient through one flat buffer, one all-reduce
    (:func:`lecture_lib.comm.all_reduce_flat`)."""

    def finish_gradient_synchronization(self) -> None:
        if self._sync:
            all_reduce_flat([p.grad for p in self.params], self.group, average=True)


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
            self._handles.append(self._all_reduce_one(p.grad, async_op=True))

    def finish_gradient_synchronization(self) -> None:
        for handle in self._handles:
            handle.wait()
        self._handles.clear()


class DDPBucketed(_DataParallel):
    """An async all-reduce per bucket of gradients, launched as soon as the bucket is full.

    Buckets are launched in index order on every rank (a bucket that fills
    early waits for the ones before it), so all ranks issue their collectives
    in the same order, as torch's DDP does.

    ``accumulation``: the backward passes that add to every gradient before it is
    complete (the micro-batches of a step); a bucket is full once each of its
    gradients has had that many, so it is reduced during the last backward only.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float | None, group=None,
                 accumulation: int = 1):
        check_bucket_size(bucket_size_mb)
        check_accumulation(accumulation)
        super().__init__(module, group)
        self.accumulation = accumulation
        self.bucket_size_mb = bucket_size_mb
        self.buckets = make_buckets(self.params, bucket_size_mb)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._ready = [0] * len(self.buckets)
        self._launched: list = []                # per launched bucket: wait and copy back
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    @property
    def accumulation(self) -> int:
        return self._accumulation

    @accumulation.setter
    def accumulation(self, backwards: int) -> None:
        check_accumulation(backwards)
        self._accumulation = backwards

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self._sync:
            return
        self._ready[self._bucket_of[id(p)]] += 1
        while (len(self._launched) < len(self.buckets)
               and self._ready[len(self._launched)]
               == self.accumulation * len(self.buckets[len(self._launched)])):
            self._launch(len(self._launched))

    def _launch(self, index: int) -> None:
        for p in self.buckets[index]:
            if p.grad is None:                   # unused this step: contributes zeros
                p.grad = torch.zeros_like(p)
        self._launched.append(all_reduce_flat([p.grad for p in self.buckets[index]],
                                              self.group, average=True, async_op=True))

    def on_train_batch_start(self) -> None:
        self._ready = [0] * len(self.buckets)

    def finish_gradient_synchronization(self) -> None:
        if not self._sync:
            return
        if len(self._launched) < len(self.buckets) and any(self._ready):
            for index in range(len(self._launched), len(self.buckets)):  # unused parameters
                self._launch(index)
        for finish in self._launched:
            finish()
        self._launched.clear()
        self._ready = [0] * len(self.buckets)


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


# ----------------------------------------------------------------------------
# Helpers: the buckets, the check, torch's DDP behind the same interface
# ----------------------------------------------------------------------------

def check_bucket_size(bucket_size_mb) -> None:
    if bucket_size_mb is None:
        return
    if isinstance(bucket_size_mb, bool) or not isinstance(bucket_size_mb, (int, float)):
        raise TypeError(f"bucket_size_mb must be a number of MB or None, "
                        f"not {type(bucket_size_mb).__name__}")
    if not bucket_size_mb > 0:
        raise ValueError(f"bucket_size_mb must be > 0 (or None for one bucket), "
                         f"not {bucket_size_mb}")


def check_accumulation(backwards) -> None:
    if isinstance(backwards, bool) or not isinstance(backwards, int) or backwards < 1:
        raise ValueError(f"accumulation must be a whole number of backward passes >= 1, "
                         f"not {backwards!r}")


def make_buckets(params, bucket_size_mb: float | None) -> list[list[torch.Tensor]]:
    """Group ``params`` in reverse order into buckets of at most ``bucket_size_mb`` MB
    (2**20 bytes); a parameter larger than that gets a bucket of its own; None: one bucket."""
    check_bucket_size(bucket_size_mb)
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


class _TorchDDP(nn.Module):
    """torch's DistributedDataParallel behind the same interface (the baseline)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25, group=None):
        super().__init__()
        check_bucket_size(bucket_size_mb)
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
