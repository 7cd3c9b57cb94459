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

import torch
import torch.nn as nn

from ..comm import all_gather_into, all_reduce_flat, group_info, reduce_scatter_into
from .shards import check_enough_elements, chunk_size, padded_flat
from .units import (
    ParamSlot,
    Unit,
    assign_owners,
    check_compute_dtype,
    parameter_slots,
    resolve_units,
)


def check_fsdp(module: nn.Module, units=None, compute_dtype=None) -> None:
    """Every check of :class:`FullyShardedModel`'s arguments, before any process starts."""
    resolve_units(module, units)
    check_compute_dtype(compute_dtype)


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
        self.gathered_bytes = self.peak_gathered_bytes = 0
        self.events: list | None = None
        self._units = [Unit(name, sub) for name, sub in unit_list]
        self._replicated: list[tuple[nn.Parameter, list, torch.Tensor | None]] = []
        self._order: list[Unit] = list(self._units)
        self._this_forward: list[Unit] = []
        self._in_flight: list = []                 # (handle, buffer, params) reduce-scatters
        self._backward_done = True
        owners = assign_owners(module, unit_list)
        for p, slots in parameter_slots(module).items():
            if owners[p] is None:
                self._add_replicated(p, slots)
            else:
                self._add_sharded(self._units[owners[p]], p, slots)
        for unit in self._units:
            unit.module.register_forward_pre_hook(lambda m, a, unit=unit: self._pre_forward(unit))
            unit.module.register_forward_hook(
                lambda m, a, out, unit=unit: self._post_forward(unit, out))
        module.register_forward_pre_hook(lambda m, a: self._root_pre_forward())
        module.register_forward_hook(lambda m, a, out: self._root_post_forward(out))

    # -- building ------------------------------------------------------------------

    def _dtype(self, p: torch.Tensor) -> torch.dtype:
        return self.compute_dtype or p.dtype

    def _add_sharded(self, unit: Unit, p: nn.Parameter, slots) -> None:
        chunk = chunk_size(p.numel(), self.world_size)
        piece = padded_flat(p.detach(), self.world_size)[self.rank * chunk:(self.rank + 1) * chunk]
        shard = nn.Parameter(piece.clone(), requires_grad=p.requires_grad)
        full = torch.empty(0, dtype=self._dtype(p), device=p.device)
        full.requires_grad_(p.requires_grad)
        if p.requires_grad:
            full.register_post_accumulate_grad_hook(lambda t, unit=unit: self._grad_ready(unit))
        for _, m, attr in slots:
            m._parameters[attr] = shard              # the module's parameter IS the shard
        unit.params.append(ParamSlot(slots[0][0], [(m, a) for _, m, a in slots], p.shape,
                                     chunk, shard, full))

    def _add_replicated(self, p: nn.Parameter, slots) -> None:
        shadow = None
        if self._dtype(p) != p.dtype:                # a compute-dtype copy, cast each forward
            shadow = torch.empty(0, dtype=self._dtype(p), device=p.device)
            shadow.requires_grad_(p.requires_grad)
        self._replicated.append((p, [(m, a) for _, m, a in slots], shadow))

    def _note(self, what: str, unit: Unit, phase: str) -> None:
        if self.events is not None:
            self.events.append((what, unit.name, phase))

    # -- gather and free -----------------------------------------------------------

    def _launch_gather(self, unit: Unit, phase: str) -> None:
        """Start the unit's one all-gather (async): every shard cast to the compute dtype."""
        if unit.gathered or unit.work is not None or not unit.params:
            return
        with torch.no_grad():
            mine = torch.cat([ps.shard.detach().to(ps.full.dtype) for ps in unit.params])
            buf = torch.empty(mine.numel() * self.world_size, dtype=mine.dtype,
                              device=mine.device)
            unit.work = (all_gather_into(buf, mine, self.group, phase, async_op=True), buf)
        self._note("gather", unit, phase)

    def _wait_gather(self, unit: Unit, phase: str) -> None:
        if unit.gathered:
            return
        self._launch_gather(unit, phase)
        self._note("wait", unit, phase)
        if unit.params:
            work, buf = unit.work
            unit.work = None
            work.wait()
            everyone, offset = buf.view(self.world_size, -1), 0
            for ps in unit.params:
                flat = everyone[:, offset:offset + ps.chunk].reshape(-1)[:ps.numel]
                ps.full.data = flat.reshape(ps.shape).clone()
                offset += ps.chunk
                for m, attr in ps.slots:
                    m.__dict__[attr] = ps.full       # shadows the shard while gathered
                self.gathered_bytes += ps.full.numel() * ps.full.element_size()
        unit.gathered = True
        unit.pending = sum(ps.shard.requires_grad for ps in unit.params)
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)
        self._note("full", unit, phase)

    def _free(self, unit: Unit, phase: str) -> None:
        if not unit.gathered:
            return
        for ps in unit.params:
            self.gathered_bytes -= ps.full.numel() * ps.full.element_size()
            ps.full.data = torch.empty(0, dtype=ps.full.dtype, device=ps.full.device)
            for m, attr in ps.slots:
                m.__dict__.pop(attr, None)
        unit.gathered = False
        self._note("free", unit, phase)

    def _neighbour(self, unit: Unit, step: int) -> Unit | None:
        if unit not in self._order:
            return None
        i = self._order.index(unit) + step
        return self._order[i] if 0 <= i < len(self._order) else None

    # -- forward -------------------------------------------------------------------

    def _root_pre_forward(self) -> None:
        self._finish_backward()                      # a forward always sees fresh shards
        for unit in self._units:
            self._drop_prefetch(unit)
            self._free(unit, "forward")
        self._this_forward = []
        for p, slots, shadow in self._replicated:
            if shadow is not None:
                shadow.data = p.detach().to(shadow.dtype)
                for m, attr in slots:
                    m.__dict__[attr] = shadow

    def _pre_forward(self, unit: Unit) -> None:
        if unit not in self._this_forward:
            self._this_forward.append(unit)
        self._wait_gather(unit, "forward")
        nxt = self._neighbour(unit, +1)
        if self.prefetch and nxt is not None:
            self._launch_gather(nxt, "forward")
        self._note("compute", unit, "forward")

    def _post_forward(self, unit: Unit, out):
        if torch.is_grad_enabled():
            first = _first_grad_tensor(out)
            if first is not None:
                first.register_hook(lambda g, unit=unit: self._pre_backward(unit, g))
        self._note("done", unit, "forward")
        if self.reshard_after_forward:
            self._free(unit, "forward")

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
        self._wait_gather(unit, "backward")
        nxt = self._neighbour(unit, -1)
        if self.prefetch and nxt is not None:
            self._launch_gather(nxt, "backward")
        self._note("compute", unit, "backward")
        return grad

    def _grad_ready(self, unit: Unit) -> None:
        unit.pending -= 1
        if unit.pending == 0:                        # every gradient of the unit is in
            self._reduce_scatter(unit)

    def _reduce_scatter(self, unit: Unit) -> None:
        """One async reduce-scatter of the unit's gradients (compute dtype); free the weights."""
        with_grad = [ps for ps in unit.params if ps.full.grad is not None]
        if with_grad:
            rows = [padded_flat(ps.full.grad, self.world_size).view(self.world_size, ps.chunk)
                    for ps in with_grad]
            stacked = torch.cat(rows, dim=1).reshape(-1)     # rank r's chunks side by side
            out = torch.empty(stacked.numel() // self.world_size, dtype=stacked.dtype,
                              device=stacked.device)
            work = reduce_scatter_into(out, stacked, self.group, "backward", async_op=True)
            self._in_flight.append((work, stacked, out, with_grad))
            for ps in with_grad:
                ps.full.grad = None
            self._note("reduce_scatter", unit, "backward")
        self._free(unit, "backward")

    def _finish_backward(self) -> None:
        """End of backward: finish every unit, wait for the reduce-scatters, sync replicas."""
        if self._backward_done:
            return
        self._backward_done = True
        for unit in self._units:
            self._drop_prefetch(unit)
            if unit.gathered:
                self._reduce_scatter(unit)          # unused parameters: what arrived, if any
        for work, _, out, params in self._in_flight:
            work.wait()
            grads = out.to(params[0].shard.dtype).div_(self.world_size)
            for ps, g in zip(params, grads.split([ps.chunk for ps in params])):
                ps.shard.grad = g.clone() if ps.shard.grad is None else ps.shard.grad.add_(g)
        self._in_flight = []
        self._sync_replicated()

    def _sync_replicated(self) -> None:
        for p, slots, shadow in self._replicated:
            if shadow is not None:
                for m, attr in slots:
                    m.__dict__.pop(attr, None)
                if shadow.grad is not None:
                    g = shadow.grad.to(p.dtype)
                    p.grad = g if p.grad is None else p.grad.add_(g)
                    shadow.grad = None
        all_reduce_flat([p.grad for p, _, _ in self._replicated], self.group, average=True,
                        phase="backward")

    def _drop_prefetch(self, unit: Unit) -> None:
        if unit.work is not None:                   # a prefetch nobody used: wait, discard
            unit.work[0].wait()
            unit.work = None

    # -- the module ----------------------------------------------------------------

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradients(self) -> bool:
        """Wait for anything outstanding; True when every gradient is in place."""
        self._finish_backward()
        return not self._in_flight

    def shard_parameters(self) -> list[nn.Parameter]:
        """This rank's parameters: the shards and the replicated ones (``self.parameters()``)."""
        return list(self.parameters())

    def units(self) -> list[Unit]:
        return list(self._units)

    def replicated_names(self) -> list[str]:
        names = {p: n for n, p in self.module.named_parameters()}
        return [names[p] for p, _, _ in self._replicated]


def _first_grad_tensor(out):
    seq = out if isinstance(out, (tuple, list)) else [out]
    return next((t for t in seq if isinstance(t, torch.Tensor) and t.requires_grad), None)
