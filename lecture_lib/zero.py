"""ZeRO: shard the optimizer state, then the gradients, then the parameters.

Rajbhandari, Rasley, Ruwase & He 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models". Plain data parallelism keeps a full copy
of every model state on every rank. ZeRO splits them over the N data-parallel
ranks instead, rank r owning the r-th 1/N of every parameter:

* **Stage 1** (:class:`ShardedOptimizer`): each rank keeps optimizer state
  (Adam's two moments) only for its own shard and steps only that shard;
  an all-gather then gives every rank the full updated parameters.
* **Stage 2** (``ShardedOptimizer(..., gradients="reduce_scatter")``): as
  each parameter's gradient is ready in backward, a reduce-scatter sums it
  over the ranks and leaves each rank only its shard; the full gradient is
  freed at once.
* **Stage 3** (:class:`FullyShardedModel`): parameters are sharded too. A
  unit (one transformer block; the rest of the model is the root unit)
  all-gathers its parameters just before its forward and again just before
  its backward, and frees them after each; gradients are reduce-scattered.
  Torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) is the production
  version; :func:`fsdp2_side_by_side` measures both in one run.

Each parameter is flattened and split into N equal chunks (the last padded
with zeros when N does not divide its size), as FSDP2 does along dim 0. AdamW
works element by element, so stepping the shards is *exactly* the unsharded
step on the same gradients. Every piece takes ``group=`` (default: the
world), so a hybrid mesh can shard over its data-parallel group alone.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .costmodel.memory import check_zero_stage
from .launch import device
from .metrics import state_bytes, tensor_bytes, wall_time
from .models import TrainResult, shard

GRADIENT_MODES = ("synced", "all_reduce", "reduce_scatter")
# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to *_single
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _group_info(group) -> tuple[int, int]:
    if not dist.is_initialized():
        raise RuntimeError("ZeRO needs an initialised process group (run it under lecture_lib.run)")
    return dist.get_rank(group), dist.get_world_size(group)


def _check_enough_elements(params, world_size: int) -> None:
    total = sum(p.numel() for p in params)
    if total < world_size:
        raise ValueError(f"more ranks ({world_size}) than parameter elements to shard ({total}): "
                         "some rank would own nothing")


# ----------------------------------------------------------------------------
# Stages 1 and 2: the sharded optimizer
# ----------------------------------------------------------------------------

class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 (and ZeRO-2): optimizer state only for this rank's shard of every parameter.

    ``ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)``, the
    interface of Stanford CS336 assignment 2. ``param_groups`` list every
    parameter (so ``zero_grad`` works); the wrapped optimizer (``.inner``) sees
    only this rank's shards, views into the parameters' own storage, so stepping
    them updates the parameters in place; ``step`` then all-gathers, and every
    rank holds the full updated parameters.

    ``gradients`` says where the averaged gradient comes from:
    ``"synced"`` (default, as in CS336): the caller already averaged it (e.g.
    DDP); ``"all_reduce"``: ``step`` averages it; ``"reduce_scatter"``
    (ZeRO-2): hooks reduce-scatter each gradient during backward and free it,
    so a rank keeps gradients for its shard only.
    """

    def __init__(self, params, optimizer_cls, group=None, gradients: str = "synced", **kwargs):
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_cls must be a torch.optim.Optimizer class, not {optimizer_cls!r}")
        if gradients not in GRADIENT_MODES:
            raise ValueError(f"gradients must be one of {GRADIENT_MODES}, not {gradients!r}")
        self.group = group
        self.rank, self.world_size = _group_info(group)
        self.gradients = gradients
        self._optimizer_cls, self._kwargs = optimizer_cls, kwargs
        self.inner: torch.optim.Optimizer | None = None
        self._shard_of: dict[nn.Parameter, nn.Parameter] = {}
        self._hooks = []
        super().__init__(params, kwargs)
        _check_enough_elements(self._shard_of, self.world_size)
        self.state = self.inner.state      # what this rank really keeps

    # -- shards -----------------------------------------------------------------

    def _bounds(self, numel: int) -> tuple[int, int, int]:
        chunk = math.ceil(numel / self.world_size)
        lo = min(self.rank * chunk, numel)
        return chunk, lo, min(lo + chunk, numel)

    def _make_shard(self, p: nn.Parameter) -> nn.Parameter:
        if not p.is_contiguous():
            raise ValueError("ShardedOptimizer needs contiguous parameters")
        _, lo, hi = self._bounds(p.numel())
        piece = nn.Parameter(p.detach().view(-1)[lo:hi], requires_grad=p.requires_grad)
        if self.gradients == "reduce_scatter" and p.requires_grad:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._reduce_scatter_grad))
        return piece

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)          # checks, fills defaults, no duplicates
        group = self.param_groups[-1]
        for p in group["params"]:
            self._shard_of[p] = self._make_shard(p)
        inner_group = {k: v for k, v in group.items() if k != "params"}
        inner_group["params"] = [self._shard_of[p] for p in group["params"]]
        if self.inner is None:
            self.inner = self._optimizer_cls([inner_group], **self._kwargs)
        else:
            self.inner.add_param_group(inner_group)

    # -- gradients --------------------------------------------------------------

    def _padded_flat(self, t: torch.Tensor, chunk: int) -> torch.Tensor:
        flat = t.reshape(-1)
        return F.pad(flat, (0, chunk * self.world_size - flat.numel()))

    def _reduce_scatter_grad(self, p: nn.Parameter) -> None:
        """ZeRO-2, in backward: sum p.grad over ranks, keep this rank's shard, free the rest."""
        chunk, lo, hi = self._bounds(p.numel())
        out = torch.empty(chunk, dtype=p.grad.dtype, device=p.grad.device)
        _reduce_scatter(out, self._padded_flat(p.grad, chunk), group=self.group)
        piece = self._shard_of[p]
        g = out[:hi - lo].div_(self.world_size)
        piece.grad = g if piece.grad is None else piece.grad.add_(g)
        p.grad = None

    def _shard_full_grads(self) -> None:
        """ZeRO-1: every rank has the full gradient; keep a copy of our slice for the step."""
        with_grad = [p for p in self._shard_of if p.grad is not None]
        if self.gradients == "all_reduce" and with_grad:
            flat = torch.cat([p.grad.reshape(-1) for p in with_grad])
            dist.all_reduce(flat, group=self.group)
            flat.div_(self.world_size)
            offset = 0
            for p in with_grad:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        for p, piece in self._shard_of.items():
            if p.grad is None:
                piece.grad = None
            else:
                _, lo, hi = self._bounds(p.numel())
                piece.grad = p.grad.reshape(-1)[lo:hi].clone()

    # -- the step ---------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.gradients != "reduce_scatter":
            self._shard_full_grads()
        self.inner.step(**kwargs)
        if self.gradients != "reduce_scatter":
            for piece in self._shard_of.values():    # the copies were only for the step
                piece.grad = None
        self._all_gather_params()
        return loss

    def _all_gather_params(self) -> None:
        """One all-gather of every shard: afterwards each rank holds all updated parameters."""
        params = list(self._shard_of)
        if not params:
            return
        chunks = [self._bounds(p.numel())[0] for p in params]
        total = sum(chunks)
        mine = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
        offset = 0
        for p, chunk in zip(params, chunks):
            piece = self._shard_of[p]
            mine[offset:offset + piece.numel()].copy_(piece.reshape(-1))
            offset += chunk
        everyone = torch.empty(total * self.world_size, dtype=mine.dtype, device=mine.device)
        _all_gather(everyone, mine, group=self.group)
        everyone = everyone.view(self.world_size, total)
        offset = 0
        for p, chunk in zip(params, chunks):
            full = everyone[:, offset:offset + chunk].reshape(-1)[:p.numel()]
            p.copy_(full.view_as(p))
            offset += chunk

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.inner.zero_grad(set_to_none)

    def shard_grad_bytes(self) -> int:
        """Bytes of shard gradients this rank holds (ZeRO-2 keeps them between backward and step)."""
        return tensor_bytes(piece.grad for piece in self._shard_of.values())


# ----------------------------------------------------------------------------
# Stage 3: fully sharded parameters
# ----------------------------------------------------------------------------

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
        self.rank, self.world_size = _group_info(group)
        _check_enough_elements(list(module.parameters()), self.world_size)
        if units is None:
            units = list(getattr(module, "blocks", []))
        self._shards: dict[nn.Parameter, nn.Parameter] = {}
        self._names = {p: n for n, p in module.named_parameters()}
        self._shapes = {p: p.shape for p in module.parameters()}   # p itself is emptied
        self._units: list[_Unit] = []
        self.gathered_bytes = self.peak_gathered_bytes = 0
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
                    lambda p, unit=unit: self._reduce_scatter_grad(p, unit))
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
            _all_gather(everyone, mine, group=self.group)
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
        outputs = [out] if isinstance(out, torch.Tensor) else \
            [t for t in (out if isinstance(out, (tuple, list)) else []) if isinstance(t, torch.Tensor)]
        hooked = False
        for t in outputs:
            if t.requires_grad and not hooked:    # just before this unit's backward: gather again
                t.register_hook(lambda g, unit=unit: (self._gather(unit), g)[1])
                hooked = True
        self._free(unit)

    def _reduce_scatter_grad(self, p: nn.Parameter, unit: _Unit) -> None:
        piece = self._shards[p]
        chunk = piece.numel()
        flat = F.pad(p.grad.reshape(-1), (0, chunk * self.world_size - p.grad.numel()))
        out = torch.empty(chunk, dtype=p.grad.dtype, device=p.grad.device)
        _reduce_scatter(out, flat, group=self.group)
        out.div_(self.world_size)
        piece.grad = out if piece.grad is None else piece.grad.add_(out)
        p.grad = None
        unit.pending -= 1
        if unit.pending == 0:                     # every gradient of the unit is out: free it
            self._free(unit)

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
            _all_gather(full, piece.detach(), group=self.group)
            shape = self._shapes[p]
            out[self._names[p]] = full[:math.prod(shape)].view(shape).clone()
        return out


# ----------------------------------------------------------------------------
# One entry point, and what a rank holds
# ----------------------------------------------------------------------------

def shard_model(model: nn.Module, stage: int, optimizer_cls=torch.optim.AdamW, group=None,
                **kwargs):
    """``(model, optimizer)`` for ZeRO ``stage`` 1, 2 or 3 over ``group``."""
    stage = check_zero_stage(stage)
    if stage == 0:
        raise ValueError("ZeRO stage 0 is plain data parallelism (lecture_lib.data_parallel); "
                         "shard_model takes stage 1, 2 or 3")
    if stage == 3:
        sharded = FullyShardedModel(model, group=group)
        return sharded, optimizer_cls(sharded.shard_parameters(), **kwargs)
    mode = "all_reduce" if stage == 1 else "reduce_scatter"
    return model, ShardedOptimizer(model.parameters(), optimizer_cls, group=group,
                                   gradients=mode, **kwargs)


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Bytes of parameters, gradients and optimizer state this rank really holds.

    Counted from the tensors: the model's parameters and gradients
    (:func:`lecture_lib.metrics.state_bytes`), plus the shards and shard
    gradients of ZeRO-2 and ZeRO-3 (ZeRO-1's shards are views of the
    parameters and are not counted twice).
    """
    if isinstance(model, FullyShardedModel):
        pieces = model.shard_parameters()
        held = state_bytes(model.module, optimizer)
        held["params"] += tensor_bytes(pieces)
        held["grads"] += tensor_bytes(p.grad for p in pieces)
        return held
    held = state_bytes(model, optimizer)
    if isinstance(optimizer, ShardedOptimizer):
        held["grads"] += optimizer.shard_grad_bytes()
    return held


def train_sharded(model: nn.Module, stage: int, batches, steps: int, lr: float = 1e-2,
                  group=None) -> dict:
    """Rank function: train ``model`` with ZeRO ``stage`` on this rank's share of each batch.

    ``batches(step) -> (x, y)`` gives the *global* batch (the same on every
    rank); each rank trains on its slice. Returns ``result`` (a
    :class:`~lecture_lib.models.TrainResult` with the global mean losses and the
    full parameters, comparable with :func:`~lecture_lib.models.train_reference`),
    ``held`` (:func:`held_bytes` after the last step, before ``zero_grad``) and
    ``step_seconds``. AdamW with weight decay 0.01, as ``models.make_optimizer``.
    """
    rank, world = _group_info(group)
    dev = device()
    model = model.to(dev)
    model, opt = shard_model(model, stage, torch.optim.AdamW, group=group, lr=lr,
                             weight_decay=0.01)
    losses, seconds, held = [], [], None
    for step in range(steps):
        x, y = (t.to(dev) for t in shard(batches(step), rank, world))
        with wall_time(dev) as t:
            opt.zero_grad(set_to_none=True)
            loss = model(x, y)
            loss.backward()
            opt.step()
        seconds.append(t.seconds)
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        losses.append(total.item() / world)
        if step == steps - 1:
            held = held_bytes(model, opt)
    if isinstance(model, FullyShardedModel):
        params = model.full_parameters()
    else:
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return {"result": TrainResult(losses, params), "held": held, "step_seconds": seconds,
            "peak_gathered_bytes": getattr(model, "peak_gathered_bytes", None)}


def fsdp2_side_by_side(make_model, batches, steps: int, lr: float = 1e-2, group=None) -> dict:
    """Rank function: our ZeRO-3 and torch FSDP2 on the same model and data, in one run.

    Both shard every block and the root; AdamW as :func:`train_sharded`.
    Returns, for ``"ours"`` and ``"fsdp2"``: ``result``, ``held`` (bytes this
    rank holds; FSDP2's DTensors counted by their local shards) and
    ``step_seconds``.
    """
    from torch.distributed.fsdp import fully_shard
    out = {"ours": train_sharded(make_model(), 3, batches, steps, lr, group)}
    rank, world = _group_info(group)
    dev = device()
    mesh = None
    if group is not None:
        from torch.distributed.device_mesh import DeviceMesh
        mesh = DeviceMesh.from_group(group, dev.type)
    model = make_model().to(dev)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses, seconds, held = [], [], None

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    for step in range(steps):
        x, y = (t.to(dev) for t in shard(batches(step), rank, world))
        with wall_time(dev) as t:
            opt.zero_grad(set_to_none=True)
            loss = model(x, y)
            loss.backward()
            opt.step()
        seconds.append(t.seconds)
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        losses.append(total.item() / world)
        if step == steps - 1:
            params = list(model.parameters())
            held = {"params": tensor_bytes(local(p) for p in params),
                    "grads": tensor_bytes(local(p.grad) if p.grad is not None else None
                                          for p in params),
                    "optimizer": tensor_bytes(local(v) for s in opt.state.values()
                                              for v in s.values() if isinstance(v, torch.Tensor))}
    full = {n: local(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}
    out["fsdp2"] = {"result": TrainResult(losses, full), "held": held, "step_seconds": seconds}
    return out
