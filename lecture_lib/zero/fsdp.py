"""ZeRO stage 3: the parameters are sharded too (fully sharded data parallelism).

Rajbhandari et al. 2020, section 5.3; Zhao et al. 2023, "PyTorch FSDP". A
unit (one transformer block; the rest of the model is the root unit)
all-gathers its parameters just before its forward and again just before its
backward, and frees them after each; once all of a unit's gradients are in,
one reduce-scatter leaves each rank its shard of them. Torch's FSDP2
(``torch.distributed.fsdp.fully_shard``) is the production version;
:func:`lecture_lib.zero.fsdp2_side_by_side` measures both in one run.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..comm import all_gather_into, group_info, reduce_scatter_into
from .shards import check_enough_elements


class _Unit:
    """The parameters gathered and freed together (one block, or the root)."""

    def __init__(self, name: str, params: list[tuple[str, nn.Parameter]]):
        self.name, self.params = name, params
        self.gathered = False
        self.pending = 0


class FullyShardedModel(nn.Module):
    """ZeRO-3 around ``module``: each rank stores 1/N of every parameter.

    ``units`` lists submodules gathered as one (default: every element of
    ``module.blocks`` when it has them); the parameters left over form the
    root unit, gathered for the whole forward. Use ``shard_parameters()`` with
    any optimizer; ``full_parameters()`` all-gathers the trained weights.
    ``peak_gathered_bytes`` is the most parameter bytes ever gathered at once.
    """

    def __init__(self, module: nn.Module, units=None, group=None):
        super().__init__()
        self.module = module
        self.group = group
        self.rank, self.world_size = group_info(group, required=True)
        check_enough_elements(list(module.parameters()), self.world_size)
        if units is None:
            units = list(getattr(module, "blocks", []))
        self._shards: dict[nn.Parameter, nn.Parameter] = {}
        self._names = {p: n for n, p in module.named_parameters()}
        self._shapes = {p: p.shape for p in module.parameters()}   # p itself is emptied
        self._units: list[_Unit] = []
        self.gathered_bytes = self.peak_gathered_bytes = 0
        self._callback_queued = False
        seen = set()
        for i, sub in enumerate(units):
            params = [(self._names[p], p) for p in sub.parameters() if p not in seen]
            seen.update(p for _, p in params)
            self._add_unit(f"unit{i}", sub, params)
        rest = [(n, p) for n, p in module.named_parameters() if p not in seen]
        self._add_unit("root", module, rest)

    def _add_unit(self, name: str, sub: nn.Module, params) -> None:
        unit = _Unit(name, params)
        self._units.append(unit)
        for _, p in params:
            chunk = math.ceil(p.numel() / self.world_size)
            flat = F.pad(p.detach().reshape(-1), (0, chunk * self.world_size - p.numel()))
            self._shards[p] = nn.Parameter(flat[self.rank * chunk:(self.rank + 1) * chunk].clone(),
                                           requires_grad=p.requires_grad)
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(
                    lambda p, unit=unit: self._grad_ready(p, unit))
        self._free(unit)
        sub.register_forward_pre_hook(lambda m, args, unit=unit: self._gather(unit))
        sub.register_forward_hook(lambda m, args, out, unit=unit: self._after_forward(unit, out))

    # -- gather and free --------------------------------------------------------

    def _gather(self, unit: _Unit) -> None:
        if unit.gathered:
            return
        if not unit.params:
            unit.gathered = True
            return
        with torch.no_grad():                    # one all-gather for the whole unit
            pieces = [self._shards[p].detach() for _, p in unit.params]
            mine = torch.cat(pieces)
            everyone = torch.empty(mine.numel() * self.world_size, dtype=mine.dtype,
                                   device=mine.device)
            all_gather_into(everyone, mine, self.group, phase="params")
            everyone = everyone.view(self.world_size, mine.numel())
            offset = 0
            for (_, p), piece in zip(unit.params, pieces):
                shape = self._shapes[p]
                full = everyone[:, offset:offset + piece.numel()].reshape(-1)
                p.data = full[:math.prod(shape)].reshape(shape).clone()
                offset += piece.numel()
                self.gathered_bytes += p.numel() * p.element_size()
        unit.gathered = True
        unit.pending = sum(p.requires_grad for _, p in unit.params)
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    def _free(self, unit: _Unit) -> None:
        for _, p in unit.params:
            if unit.gathered:
                self.gathered_bytes -= p.numel() * p.element_size()
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        unit.gathered = False

    def _after_forward(self, unit: _Unit, out):
        seq = out if isinstance(out, (tuple, list)) else [out]
        outputs = [t for t in seq if isinstance(t, torch.Tensor)]
        hooked = False
        for t in outputs:
            if t.requires_grad and not hooked:    # just before this unit's backward: gather again
                t.register_hook(lambda g, unit=unit: self._before_backward(unit, g))
                hooked = True
        self._free(unit)

    def _before_backward(self, unit: _Unit, grad):
        self._gather(unit)
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._callback_queued = True
        return grad

    def _grad_ready(self, p: nn.Parameter, unit: _Unit) -> None:
        unit.pending -= 1
        if unit.pending == 0:                     # every gradient of the unit is in
            self._reduce_scatter_unit(unit)

    def _reduce_scatter_unit(self, unit: _Unit) -> None:
        """One reduce-scatter for the unit's gradients; keep our shard, free the rest."""
        with_grad = [p for _, p in unit.params if p.grad is not None]
        if with_grad:
            pieces = [self._shards[p] for p in with_grad]
            rows = [F.pad(p.grad.reshape(-1), (0, piece.numel() * self.world_size - p.grad.numel()))
                    .view(self.world_size, piece.numel()) for p, piece in zip(with_grad, pieces)]
            stacked = torch.cat(rows, dim=1).reshape(-1)      # rank r's chunks side by side
            out = torch.empty(stacked.numel() // self.world_size, dtype=stacked.dtype,
                              device=stacked.device)
            reduce_scatter_into(out, stacked, self.group, phase="grads")
            out.div_(self.world_size)
            offset = 0
            for p, piece in zip(with_grad, pieces):
                g = out[offset:offset + piece.numel()]
                piece.grad = g.clone() if piece.grad is None else piece.grad.add_(g)
                offset += piece.numel()
                p.grad = None
        self._free(unit)

    def _end_of_backward(self) -> None:
        """Units whose gradients did not all arrive (unused parameters): finish them now."""
        self._callback_queued = False
        for unit in self._units:
            if unit.gathered:
                self._reduce_scatter_unit(unit)

    # -- the module -------------------------------------------------------------

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def shard_parameters(self) -> list[nn.Parameter]:
        """This rank's shards, in the module's parameter order: give these to the optimizer."""
        return [self._shards[p] for p in self.module.parameters()]

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every full parameter, all-gathered (on every rank)."""
        out = {}
        for p, piece in self._shards.items():
            full = torch.empty(piece.numel() * self.world_size, dtype=piece.dtype,
                               device=piece.device)
            all_gather_into(full, piece.detach(), self.group, phase="params")
            shape = self._shapes[p]
            out[self._names[p]] = full[:math.prod(shape)].view(shape).clone()
        return out
