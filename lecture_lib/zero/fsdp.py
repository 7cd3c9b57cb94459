"""ZeRO stage 3 as FSDP: the module's parameters *are* this rank's shards.

Rajbhandari et al. 2020 ("ZeRO", section 5.3) and Zhao et al. 2023
("PyTorch FSDP"). Each unit (:mod:`.units`) keeps only its shard between
steps. Just before the unit's forward its shard is cast to ``compute_dtype``
and all-gathered (16-bit weights: half the bytes on the wire); after the
forward the full weights are freed (``reshard_after_forward=True``) and
gathered again just before the unit's backward; once every gradient of the
unit is in, one reduce-scatter (in the compute dtype) leaves each rank its
shard of the summed gradient, which becomes the shard's fp32 ``.grad``.
Per step a rank sends 3 Psi (two all-gathers and a reduce-scatter) against
2 Psi for ZeRO-1/2 (section 7); without resharding it keeps the full weights
from forward to backward and sends 2 Psi, holding more.

Prefetching: while unit k computes, the all-gather of the unit after it is
already in flight (``async_op``); in backward the next unit in reverse order.
The order is the one the previous forward ran (module order the first time).

Who does what: each unit (:class:`~.units.Unit`) knows how to gather, free
and reduce-scatter itself; the model below only decides when, from its hooks
on the modules and the gradients, keeps the order of the units, launches the
prefetches, and at the end of backward waits for the reduce-scatters in the
order they were launched and all-reduces the replicated parameters
(:class:`Replicated`).

Like FSDP2, ``model.parameters()`` are the local shards (fp32 masters, padded
to ``ceil(numel / N)`` elements), so ``torch.optim.AdamW(model.parameters())``
trains the sharded model. FSDP2 makes each parameter a ``DTensor`` that
knows its full shape and placement; the course keeps plain 1-D tensors so
that a student can read every byte: the full shape lives in the unit, and
:func:`lecture_lib.zero.fsdp_gather_full_params` rebuilds the full weights.
During a unit's forward the gathered weight shadows the shard on the
submodule (an instance attribute of the same name), as FSDP2 swaps in its
unsharded parameter. Gradients of replicated parameters are all-reduced at
the end of backward; all of this needs no call from the user, and
``fsdp_on_after_backward`` (CS336's interface) only checks that it is done.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..comm import all_reduce_flat, group_info
from .shards import check_enough_elements
from .units import (
    ReduceScatter,
    Unit,
    assign_owners,
    check_compute_dtype,
    parameter_slots,
    resolve_units,
    shard_parameter,
)


def check_fsdp(module: nn.Module, units=None, compute_dtype=None) -> None:
    """Every check of :class:`FullyShardedModel`'s arguments, before any process starts."""
    resolve_units(module, units)
    check_compute_dtype(compute_dtype)


@dataclass(frozen=True, eq=False)
class Replicated:
    """A parameter outside every unit: whole on every rank, its gradient all-reduced.

    With a ``compute_dtype`` other than its own, ``shadow`` is its compute-dtype
    copy, cast before each forward and shadowing it on its modules, as a unit's
    full weights shadow the shards."""
    param: nn.Parameter
    slots: list[tuple[nn.Module, str]]          # every (module, attribute) holding it
    shadow: torch.Tensor | None

    @classmethod
    def of(cls, p: nn.Parameter, slots, compute_dtype: torch.dtype | None) -> Replicated:
        shadow = None
        if (compute_dtype or p.dtype) != p.dtype:
            shadow = torch.empty(0, dtype=compute_dtype, device=p.device)
            shadow.requires_grad_(p.requires_grad)
        return cls(p, [(m, a) for _, m, a in slots], shadow)

    def cast(self) -> None:
        """Before forward: the compute-dtype copy in place of the parameter."""
        if self.shadow is not None:
            self.shadow.data = self.param.detach().to(self.shadow.dtype)
            for m, attr in self.slots:
                m.__dict__[attr] = self.shadow

    def uncast(self) -> None:
        """After backward: the parameter back, the copy's gradient added to its ``.grad``."""
        if self.shadow is None:
            return
        for m, attr in self.slots:
            m.__dict__.pop(attr, None)
        if self.shadow.grad is not None:
            g = self.shadow.grad.to(self.param.dtype)
            self.param.grad = g if self.param.grad is None else self.param.grad.add_(g)
            self.shadow.grad = None


class FullyShardedModel(nn.Module):
    """FSDP around ``module``; ``units``: a predicate, a list of submodules, or the default.

    ``compute_dtype`` (``torch.bfloat16``, ``torch.float16``, or ``None``: the
    parameters' own dtype) is what forward and backward run in.
    ``reshard_after_forward`` frees full weights after forward; ``prefetch``
    overlaps the next unit's all-gather with this unit's compute.
    ``peak_gathered_bytes`` is the most full-weight bytes held at once;
    ``events`` (a list, off while ``None``) records ``(what, unit, phase)``, what
    being gather (launched), wait, full, compute, done, reduce_scatter or free.
    """

    def __init__(self, module: nn.Module, units=None, group=None, compute_dtype=None,
                 reshard_after_forward: bool = True, prefetch: bool = True):
        super().__init__()
        unit_list = resolve_units(module, units)
        self.compute_dtype = check_compute_dtype(compute_dtype)
        self.group = group
        self.rank, self.world_size = group_info(group, required=True)
        check_enough_elements(module.parameters(), self.world_size)
        self.module = module
        self.reshard_after_forward, self.prefetch = reshard_after_forward, prefetch
        self.peak_gathered_bytes = 0
        self.events: list | None = None
        self._units = [Unit(name, sub, group, self.world_size, self._note)
                       for name, sub in unit_list]
        self._replicated: list[Replicated] = []
        self._order: list[Unit] = list(self._units)      # as the last forward ran them
        self._this_forward: list[Unit] = []
        self._reduce_scatters: list[ReduceScatter] = []  # in flight, in launch order
        self._backward_done = True
        owners = assign_owners(module, unit_list)
        for p, slots in parameter_slots(module).items():
            if owners[p] is None:
                self._replicated.append(Replicated.of(p, slots, self.compute_dtype))
                continue
            unit = self._units[owners[p]]
            unit.params.append(shard_parameter(p, slots, self.rank, self.world_size,
                                               self.compute_dtype))
            if p.requires_grad:
                unit.params[-1].full.register_post_accumulate_grad_hook(
                    lambda t, unit=unit: self._post_backward(unit))
        self._register_forward_hooks()

    def _register_forward_hooks(self) -> None:
        for unit in self._units:
            unit.module.register_forward_pre_hook(lambda m, a, unit=unit: self._pre_forward(unit))
            unit.module.register_forward_hook(
                lambda m, a, out, unit=unit: self._post_forward(unit, out))
        self.module.register_forward_pre_hook(lambda m, a: self._root_pre_forward())
        self.module.register_forward_hook(lambda m, a, out: self._root_post_forward(out))

    def _note(self, what: str, unit: str, phase: str) -> None:
        if self.events is not None:
            self.events.append((what, unit, phase))

    @property
    def gathered_bytes(self) -> int:
        """Full-weight bytes held now: every gathered unit's."""
        return sum(unit.full_bytes for unit in self._units if unit.gathered)

    def _gather_and_prefetch(self, unit: Unit, phase: str, step: int) -> None:
        """``unit`` gathered; with ``prefetch``, the gather of the unit ``step`` after it
        in the last forward's order (+1 in forward, -1 in backward) launched."""
        unit.wait_gather(phase)
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)
        if self.prefetch and unit in self._order:
            i = self._order.index(unit) + step
            if 0 <= i < len(self._order):
                self._order[i].launch_gather(phase)
        self._note("compute", unit.name, phase)

    # -- forward -------------------------------------------------------------------

    def _root_pre_forward(self) -> None:
        self._finish_backward()                      # a forward always sees fresh shards
        for unit in self._units:
            unit.drop_prefetch()
            unit.free("forward")
        self._this_forward = []
        for replicated in self._replicated:
            replicated.cast()

    def _pre_forward(self, unit: Unit) -> None:
        if unit not in self._this_forward:
            self._this_forward.append(unit)
        self._gather_and_prefetch(unit, "forward", +1)

    def _post_forward(self, unit: Unit, out):
        if torch.is_grad_enabled():
            first = _first_grad_tensor(out)
            if first is not None:
                first.register_hook(lambda g, unit=unit: self._pre_backward(unit, g))
        self._note("done", unit.name, "forward")
        if self.reshard_after_forward:
            unit.free("forward")

    def _root_post_forward(self, out):
        if self._this_forward:
            self._order = list(self._this_forward)
        first = _first_grad_tensor(out) if torch.is_grad_enabled() else None
        if first is not None:
            self._backward_done = False
            first.register_hook(self._queue_end_of_backward)

    # -- backward ------------------------------------------------------------------

    def _queue_end_of_backward(self, grad):
        torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        return grad

    def _pre_backward(self, unit: Unit, grad):
        self._gather_and_prefetch(unit, "backward", -1)
        return grad

    def _post_backward(self, unit: Unit) -> None:
        if unit.grad_arrived():                      # every gradient of the unit is in
            self._reduce_scatter(unit)

    def _reduce_scatter(self, unit: Unit) -> None:
        launched = unit.reduce_scatter()
        if launched is not None:                     # waited for at the end of backward
            self._reduce_scatters.append(launched)

    def _finish_backward(self) -> None:
        """End of backward: finish every unit, wait for the reduce-scatters, sync replicas."""
        if self._backward_done:
            return
        self._backward_done = True
        for unit in self._units:
            unit.drop_prefetch()
            if unit.gathered:
                self._reduce_scatter(unit)          # unused parameters: what arrived, if any
        for launched in self._reduce_scatters:
            launched.finish(self.world_size)
        self._reduce_scatters = []
        for replicated in self._replicated:
            replicated.uncast()
        all_reduce_flat([r.param.grad for r in self._replicated], self.group, average=True,
                        phase="backward")

    # -- the module ----------------------------------------------------------------

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradients(self) -> bool:
        """Wait for anything outstanding; True when every gradient is in place."""
        self._finish_backward()
        return not self._reduce_scatters

    def shard_parameters(self) -> list[nn.Parameter]:
        """This rank's parameters: the shards and the replicated ones (``self.parameters()``)."""
        return list(self.parameters())

    def units(self) -> list[Unit]:
        return list(self._units)

    def replicated_names(self) -> list[str]:
        names = {p: n for n, p in self.module.named_parameters()}
        return [names[r.param] for r in self._replicated]


def _first_grad_tensor(out):
    seq = out if isinstance(out, (tuple, list)) else [out]
    return next((t for t in seq if isinstance(t, torch.Tensor) and t.requires_grad), None)
