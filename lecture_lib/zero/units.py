"""FSDP's unit: which parameters are gathered together (the wrap policy), and one unit's life.

A *unit* is a submodule whose parameters are all-gathered, used and freed
together (Zhao et al. 2023, "PyTorch FSDP", section 3.1; FSDP2's
``fully_shard(submodule)``). Small units keep little gathered at once but send
many small messages; large ones the reverse. The default policy, as Stanford
CS336 (2026) and torchtitan wrap a transformer: every transformer block (the
GPT's ``blocks``) and every ``nn.Linear`` and ``nn.Embedding`` outside them.
A user passes a predicate ``policy(module) -> bool`` (the outermost match
wins) or a list of submodules instead.

Parameters outside every unit (the final LayerNorm of the course's GPT) stay
*replicated*: every rank holds them whole and their gradients are all-reduced.
A parameter shared by two units (tied weights) stays replicated too, so that
neither unit frees what the other still uses. The policy runs before any
process starts, so bad input fails early.

A :class:`Unit` is then a small state machine, as FSDP2's ``FSDPParamGroup``:
*sharded* (each rank holds its shard of every parameter), *gathering* (one
all-gather in flight: :meth:`Unit.launch_gather`, early when prefetched),
*gathered* (:meth:`Unit.wait_gather`: the full weights shadow the shards on
their modules), and sharded again, either freed (:meth:`Unit.free`, after
forward) or once its gradients are in (:meth:`Unit.reduce_scatter`). Work in
flight is a small record, :class:`Gather` or :class:`ReduceScatter`, whose
buffer is read only after its wait. When each unit moves is the model's
business (:mod:`.fsdp`): the hooks, the order of the units, prefetching.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from ..comm import all_gather_into, reduce_scatter_into
from .shards import chunk_size, padded_flat


def check_compute_dtype(compute_dtype) -> torch.dtype | None:
    """``None`` (compute in the parameters' own dtype) or a floating-point ``torch.dtype``."""
    if compute_dtype is None:
        return None
    if not isinstance(compute_dtype, torch.dtype):
        raise TypeError(f"compute_dtype must be a torch.dtype such as torch.bfloat16, "
                        f"not {compute_dtype!r}")
    if not compute_dtype.is_floating_point:
        raise TypeError(f"compute_dtype must be a floating-point dtype, not {compute_dtype}")
    return compute_dtype


def default_policy(module: nn.Module) -> list[nn.Module]:
    """The GPT's blocks, then every ``nn.Linear``/``nn.Embedding`` outside them."""
    blocks = getattr(module, "blocks", None)
    chosen = list(blocks) if isinstance(blocks, nn.ModuleList) else []
    inside = {id(m) for b in chosen for m in b.modules()}
    chosen += [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Embedding))
               and id(m) not in inside and m is not module]
    return chosen


def resolve_units(module: nn.Module, units=None) -> list[tuple[str, nn.Module]]:
    """``[(qualified name, submodule)]`` in module order; a clear error for bad input."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"FSDP wraps an nn.Module, not {type(module).__name__}")
    names = {id(m): n for n, m in module.named_modules()}
    if units is None:
        chosen = default_policy(module)
    elif callable(units) and not isinstance(units, nn.Module):
        chosen, inside = [], set()
        for m in module.modules():
            if m is not module and id(m) not in inside and units(m):
                chosen.append(m)
                inside.update(id(s) for s in m.modules())
    else:
        chosen = list(units)
        for m in chosen:
            if not isinstance(m, nn.Module) or id(m) not in names:
                raise ValueError(f"unit {type(m).__name__} is not a submodule of the wrapped "
                                 f"{type(module).__name__}")
            if m is module:
                raise ValueError("the wrapped module itself cannot be a unit: what lies "
                                 "outside every unit stays replicated")
        for m in chosen:
            for other in chosen:
                if other is not m and any(s is m for s in other.modules()):
                    raise ValueError(f"unit {names[id(m)]!r} lies inside unit "
                                     f"{names[id(other)]!r}: units must not nest")
    order = {id(m): i for i, m in enumerate(module.modules())}
    chosen = sorted({id(m): m for m in chosen}.values(), key=lambda m: order[id(m)])
    return [(names[id(m)], m) for m in chosen]


def parameter_slots(module: nn.Module) -> dict[nn.Parameter, list[tuple[str, nn.Module, str]]]:
    """Every parameter with each ``(qualified name, module, attribute)`` that holds it."""
    out: dict[nn.Parameter, list] = {}
    for prefix, m in module.named_modules(remove_duplicate=False):
        for attr, p in m._parameters.items():
            if p is not None:
                name = f"{prefix}.{attr}" if prefix else attr
                if all(s[1] is not m or s[2] != attr for s in out.get(p, [])):
                    out.setdefault(p, []).append((name, m, attr))
    return out


def assign_owners(module: nn.Module, units) -> dict[nn.Parameter, int | None]:
    """Each parameter's unit index, or ``None`` (replicated: outside every unit, or tied across)."""
    unit_of = {}
    for i, (_, sub) in enumerate(units):
        for m in sub.modules():
            unit_of.setdefault(id(m), i)
    owners: dict[nn.Parameter, int | None] = {}
    for p, slots in parameter_slots(module).items():
        found = {unit_of.get(id(m)) for _, m, _ in slots}
        owners[p] = found.pop() if len(found) == 1 else None
    return owners


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


def shard_parameter(p: nn.Parameter, slots, rank: int, world_size: int,
                    compute_dtype: torch.dtype | None) -> ParamSlot:
    """Put this rank's shard of ``p`` in every ``(name, module, attribute)`` that held ``p``."""
    chunk = chunk_size(p.numel(), world_size)
    piece = padded_flat(p.detach(), world_size)[rank * chunk:(rank + 1) * chunk]
    shard = nn.Parameter(piece.clone(), requires_grad=p.requires_grad)
    full = torch.empty(0, dtype=compute_dtype or p.dtype, device=p.device)
    full.requires_grad_(p.requires_grad)
    for _, m, attr in slots:
        m._parameters[attr] = shard              # the module's parameter IS the shard
    return ParamSlot(slots[0][0], [(m, a) for _, m, a in slots], p.shape, chunk, shard, full)


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
            ps.shard.grad = g.clone() if ps.shard.grad is None else ps.shard.grad.add_(g)


class Unit:
    """One unit's parameters and where it stands; each method is one transition.

    ``note(what, unit name, phase)`` hears of each transition (the model's events).
    """

    def __init__(self, name: str, module: nn.Module, group, world_size: int,
                 note: Callable[[str, str, str], None]):
        self.name, self.module = name, module
        self.group, self.world_size, self.note = group, world_size, note
        self.params: list[ParamSlot] = []
        self.gathered = False                   # the full weights are in place
        self.gather_in_flight: Gather | None = None  # launched, not yet waited for
        self.grads_to_come = 0                  # gradients still to arrive this backward

    @property
    def full_bytes(self) -> int:
        """Bytes of the full weights (compute dtype) the unit holds while gathered."""
        return sum(ps.numel * ps.full.element_size() for ps in self.params)

    def launch_gather(self, phase: str) -> None:
        """Start the unit's one all-gather (async): every shard cast to the compute dtype."""
        if self.gathered or self.gather_in_flight is not None or not self.params:
            return
        with torch.no_grad():
            mine = torch.cat([ps.shard.detach().to(ps.full.dtype) for ps in self.params])
            buf = torch.empty(mine.numel() * self.world_size, dtype=mine.dtype,
                              device=mine.device)
            work = all_gather_into(buf, mine, self.group, phase, async_op=True)
            self.gather_in_flight = Gather(work, buf)
        self.note("gather", self.name, phase)

    def wait_gather(self, phase: str) -> None:
        """Gathered: wait for the all-gather (launching it if nobody did), place the weights."""
        if self.gathered:
            return
        self.launch_gather(phase)
        self.note("wait", self.name, phase)
        if self.params:
            gather, self.gather_in_flight = self.gather_in_flight, None
            everyone, offset = gather.wait().view(self.world_size, -1), 0
            for ps in self.params:
                flat = everyone[:, offset:offset + ps.chunk].reshape(-1)[:ps.numel]
                ps.full.data = flat.reshape(ps.shape).clone()
                offset += ps.chunk
                for m, attr in ps.slots:
                    m.__dict__[attr] = ps.full       # shadows the shard while gathered
        self.gathered = True
        self.grads_to_come = sum(ps.shard.requires_grad for ps in self.params)
        self.note("full", self.name, phase)

    def free(self, phase: str) -> None:
        """Sharded again: the full weights dropped, the shards show through."""
        if not self.gathered:
            return
        for ps in self.params:
            ps.full.data = torch.empty(0, dtype=ps.full.dtype, device=ps.full.device)
            for m, attr in ps.slots:
                m.__dict__.pop(attr, None)
        self.gathered = False
        self.note("free", self.name, phase)

    def drop_prefetch(self) -> None:
        """Wait for an all-gather nobody used, and discard it."""
        if self.gather_in_flight is not None:
            self.gather_in_flight.wait()
            self.gather_in_flight = None

    def grad_arrived(self) -> bool:
        """Count one gradient in: True at the last one the unit waits for this backward."""
        self.grads_to_come -= 1
        return self.grads_to_come == 0

    def reduce_scatter(self) -> ReduceScatter | None:
        """One async reduce-scatter of the gradients that arrived (compute dtype); then free."""
        with_grad = [ps for ps in self.params if ps.full.grad is not None]
        launched = None
        if with_grad:
            rows = [padded_flat(ps.full.grad, self.world_size).view(self.world_size, ps.chunk)
                    for ps in with_grad]
            sent = torch.cat(rows, dim=1).reshape(-1)          # rank r's chunks side by side
            summed = torch.empty(sent.numel() // self.world_size, dtype=sent.dtype,
                                 device=sent.device)
            work = reduce_scatter_into(summed, sent, self.group, "backward", async_op=True)
            launched = ReduceScatter(work, sent, summed, tuple(with_grad))
            for ps in with_grad:
                ps.full.grad = None
            self.note("reduce_scatter", self.name, "backward")
        self.free("backward")
        return launched
