"""One FSDP unit's life: sharded, gathering, gathered, and sharded again.

A :class:`Unit` is a small state machine, as FSDP2's ``FSDPParamGroup`` (Zhao et al.
2023, "PyTorch FSDP", figure 2)::

    sharded --launch_gather--> in flight --wait_gather--> gathered --free--> sharded
                                                             |
                                           (backward) reduce_scatter, then free

*sharded*: each rank holds its shard of every parameter; *in flight*: one all-gather
launched (early, when prefetched); *gathered*: the full weights shadow the shards on
their modules; back to sharded either freed after forward or once its gradients are in
and reduce-scattered. Work in flight is a small record, :class:`Gather` or
:class:`ReduceScatter`, whose buffer is read only after its wait. *When* each unit moves
is the model's business (:mod:`.fsdp`). Each transition tells whoever watches
(``observe.note("fsdp", event=..., unit=...)``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import observe
from ..comm import all_gather_into, reduce_scatter_into
from .shards import pack, unpack


class Unit:
    """One unit's parameters and where it stands; each method is one transition."""

    def __init__(self, name: str, module: nn.Module, group, world_size: int):
        self.name, self.module = name, module
        self.group, self.world_size = group, world_size
        self.params: list[ParamSlot] = []
        self.gathered = False                   # the full weights are in place
        self.in_flight: Gather | None = None    # an all-gather launched, not yet waited for
        self.grads_to_come = 0                  # gradients still to arrive this backward

    @property
    def full_bytes(self) -> int:
        """Bytes of the full weights (compute dtype) the unit holds while gathered."""
        return sum(ps.numel * ps.full.element_size() for ps in self.params)

    def launch_gather(self) -> None:
        """Start the unit's one all-gather (async): every shard, cast to the compute dtype."""
        if self.gathered or self.in_flight is not None or not self.params:
            return
        with torch.no_grad():
            mine = torch.cat([ps.shard.detach() for ps in self.params])
            mine = mine.to(self.params[0].full.dtype)
            out = torch.empty(mine.numel() * self.world_size, dtype=mine.dtype,
                              device=mine.device)
            work = all_gather_into(out, mine, self.group, "params", async_op=True)
        self.in_flight = Gather(work, out)
        observe.note("fsdp", event="gather", unit=self.name)

    def wait_gather(self) -> None:
        """Gathered: wait for the all-gather (launching it if nobody did), place the weights."""
        if self.gathered:
            return
        self.launch_gather()
        observe.note("fsdp", event="wait", unit=self.name)
        if self.params:
            gather, self.in_flight = self.in_flight, None
            fulls = [torch.empty(ps.chunk * self.world_size, dtype=ps.full.dtype,
                                 device=ps.full.device) for ps in self.params]
            unpack(gather.wait(), fulls, self.world_size)
            for ps, full in zip(self.params, fulls):
                ps.full.data = full[:ps.numel].view(ps.shape)
                for m, attr in ps.slots:
                    m.__dict__[attr] = ps.full       # shadows the shard while gathered
        self.gathered = True
        self.grads_to_come = sum(ps.shard.requires_grad for ps in self.params)
        observe.note("fsdp", event="full", unit=self.name, nbytes=self.full_bytes)

    def free(self) -> None:
        """Sharded again: the full weights dropped, the shards show through."""
        if not self.gathered:
            return
        for ps in self.params:
            ps.full.data = torch.empty(0, dtype=ps.full.dtype, device=ps.full.device)
            for m, attr in ps.slots:
                m.__dict__.pop(attr, None)
        self.gathered = False
        observe.note("fsdp", event="free", unit=self.name)

    def drop_prefetch(self) -> None:
        """Wait for an all-gather nobody used, and discard it."""
        if self.in_flight is not None:
            self.in_flight.wait()
            self.in_flight = None

    def grad_arrived(self) -> bool:
        """Count one gradient in: True at the last one the unit waits for this backward."""
        self.grads_to_come -= 1
        return self.grads_to_come == 0

    def reduce_scatter(self) -> ReduceScatter | None:
        """One async reduce-scatter of the gradients that arrived (compute dtype); then free."""
        with_grad = [ps for ps in self.params if ps.full.grad is not None]
        launched = None
        if with_grad:
            sent = pack([ps.full.grad for ps in with_grad], self.world_size)
            summed = torch.empty(sent.numel() // self.world_size, dtype=sent.dtype,
                                 device=sent.device)
            work = reduce_scatter_into(summed, sent, self.group, "grads", async_op=True)
            launched = ReduceScatter(work, sent, summed, tuple(with_grad))
            for ps in with_grad:
                ps.full.grad = None
            observe.note("fsdp", event="reduce_scatter", unit=self.name)
        self.free()
        return launched


@dataclass(frozen=True, eq=False)
class ParamSlot:
    """One parameter of a unit: where it sits, its full shape, its shard and full tensors."""
    name: str                                   # qualified name in the wrapped module
    slots: list[tuple[nn.Module, str]]          # every (module, attribute) holding it
    shape: torch.Size
    chunk: int                                  # elements per rank (padded)
    shard: nn.Parameter                         # this rank's piece, the master dtype
    full: torch.Tensor                          # the gathered weight, compute dtype (a leaf)

    @property
    def numel(self) -> int:
        return self.shape.numel()


@dataclass(frozen=True, eq=False)
class Gather:
    """An all-gather in flight: its handle and the buffer it fills with every rank's shards."""
    work: object
    buffer: torch.Tensor

    def wait(self) -> torch.Tensor:
        """The buffer, handed out only after the wait. On a GPU NCCL's ``wait()`` does not
        block the host: it makes the current CUDA stream wait for the collective's, so a
        kernel queued on the current stream after it reads the gathered bytes, while one
        queued before it would race the all-gather."""
        self.work.wait()
        return self.buffer


@dataclass(frozen=True, eq=False)
class ReduceScatter:
    """A reduce-scatter in flight: its handle, its buffers and the parameters it is for."""
    work: object
    sent: torch.Tensor                          # every rank's chunks side by side (kept alive)
    summed: torch.Tensor                        # this rank's chunk of the sum, once waited
    params: tuple[ParamSlot, ...]

    def finish(self, world_size: int) -> None:
        """Wait, then add this rank's averaged gradient to each shard's ``.grad``."""
        self.work.wait()
        grads = self.summed.to(self.params[0].shard.dtype).div_(world_size)
        for ps, g in zip(self.params, grads.split([ps.chunk for ps in self.params])):
            ps.shard.grad = g if ps.shard.grad is None else ps.shard.grad.add_(g)
