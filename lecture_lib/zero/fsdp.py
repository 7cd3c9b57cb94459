"""ZeRO stage 3 as FSDP: the module's parameters *are* this rank's shards.

Rajbhandari et al. 2020 ("ZeRO", section 5.3); Zhao et al. 2023 ("PyTorch FSDP"). Between
steps each unit (:mod:`.wrap`: a block, an embedding, the head) keeps only its shard; in
a step, for each unit in turn::

    forward    all-gather the full weights (in compute_dtype) -> compute -> free
    backward   all-gather again -> gradients -> reduce-scatter: chunk r of the sum, rank r

3 Psi per step (two all-gathers, a reduce-scatter) against ZeRO-1/2's 2 Psi (section 7);
``reshard_after_forward=False`` keeps the full weights until backward (2 Psi, more held).
``prefetch``: while unit k computes, the next unit's all-gather (in the last forward's
order, reversed in backward) is already in flight. A unit knows how to move
(:class:`~.units.Unit`); this model decides *when*, from hooks on modules and gradients.
As in FSDP2, ``model.parameters()`` are the local shards (fp32, padded to ``ceil(numel /
N)``), so ``torch.optim.AdamW(model.parameters())`` trains the sharded model; they are
plain 1-D tensors, not DTensors, so that every byte can be read.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import observe
from ..comm import all_reduce_flat, group_info
from .shards import check_enough_elements
from .units import ReduceScatter, Unit
from .wrap import (
    assign_owners,
    check_compute_dtype,
    parameter_slots,
    resolve_units,
    shard_parameter,
)


class FullyShardedModel(nn.Module):
    """FSDP around ``module``; ``units``: a predicate, a list of submodules, or the default.

    ``compute_dtype`` (``torch.bfloat16``, ``torch.float16``, or ``None``: the parameters'
    own dtype) is what forward and backward run in. ``reshard_after_forward`` frees the
    full weights after forward; ``prefetch`` overlaps the next unit's all-gather with this
    unit's compute.
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
        self._units = [Unit(name, sub, group, self.world_size) for name, sub in unit_list]
        self._replicated: list[Replicated] = []
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
        self._order: list[Unit] = list(self._units)      # as the last forward ran them
        self._this_forward: list[Unit] = []
        self._reduce_scatters: list[ReduceScatter] = []  # in flight, in launch order
        self._backward_done = True
        for unit in self._units:
            unit.module.register_forward_pre_hook(lambda m, a, unit=unit: self._pre_forward(unit))
            unit.module.register_forward_hook(
                lambda m, a, out, unit=unit: self._post_forward(unit, out))
        module.register_forward_pre_hook(lambda m, a: self._root_pre_forward())
        module.register_forward_hook(lambda m, a, out: self._root_post_forward(out))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # -- forward: the hooks, in the order they run ---------------------------------

    def _root_pre_forward(self) -> None:
        self._finish_backward()                      # a forward always sees fresh shards
        for unit in self._units:
            unit.drop_prefetch()
            unit.free()
        self._this_forward = []
        for replicated in self._replicated:
            replicated.cast()

    def _pre_forward(self, unit: Unit) -> None:
        if unit not in self._this_forward:
            self._this_forward.append(unit)
        self._gather_and_prefetch(unit, +1)

    def _post_forward(self, unit: Unit, out):
        if torch.is_grad_enabled():
            first = _first_grad_tensor(out)
            if first is not None:
                first.register_hook(lambda g, unit=unit: self._pre_backward(unit, g))
        observe.note("fsdp", event="done", unit=unit.name)
        if self.reshard_after_forward:
            unit.free()

    def _root_post_forward(self, out):
        if self._this_forward:
            self._order = list(self._this_forward)
        first = _first_grad_tensor(out) if torch.is_grad_enabled() else None
        if first is not None:
            self._backward_done = False
            first.register_hook(self._queue_end_of_backward)

    def _gather_and_prefetch(self, unit: Unit, step: int) -> None:
        """``unit`` gathered; with ``prefetch``, the gather of the unit ``step`` after it in
        the last forward's order (+1 in forward, -1 in backward) launched."""
        unit.wait_gather()
        if self.prefetch and unit in self._order:
            i = self._order.index(unit) + step
            if 0 <= i < len(self._order):
                self._order[i].launch_gather()
        observe.note("fsdp", event="compute", unit=unit.name)

    # -- backward --------------------------------------------------------------------

    def _pre_backward(self, unit: Unit, grad):
        self._gather_and_prefetch(unit, -1)
        return grad

    def _post_backward(self, unit: Unit) -> None:
        if unit.grad_arrived():                      # every gradient of the unit is in
            self._reduce_scatter(unit)

    def _reduce_scatter(self, unit: Unit) -> None:
        launched = unit.reduce_scatter()
        if launched is not None:                     # waited for at the end of backward
            self._reduce_scatters.append(launched)

    def _queue_end_of_backward(self, grad):
        torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        return grad

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
                        phase="grads")

    # -- what callers ask --------------------------------------------------------------

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


@dataclass(frozen=True, eq=False)
class Replicated:
    """A parameter outside every unit: whole on every rank, its gradient all-reduced.

    With a ``compute_dtype`` other than its own, ``shadow`` is its compute-dtype copy, cast
    before each forward and shadowing it on its modules, as a unit's full weights shadow
    the shards."""
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


def _first_grad_tensor(out):
    seq = out if isinstance(out, (tuple, list)) else [out]
    return next((t for t in seq if isinstance(t, torch.Tensor) and t.requires_grad), None)
