"""What the notebooks run to measure ZeRO: training loops, bytes held, FSDP2 side by side.

:func:`shard_model` is the one entry point for stage 1, 2 or 3;
:func:`train_sharded` trains a model with it on this rank's share of each
batch, comparable with :func:`lecture_lib.models.train_reference`;
:func:`held_bytes` counts what a rank really holds; :func:`fsdp2_side_by_side`
runs our ZeRO-3 and torch's FSDP2 (Zhao et al. 2023) on the same model and data.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from ..comm import group_info
from ..costmodel.memory import check_zero_stage
from ..launch import device
from ..metrics import state_bytes, tensor_bytes, wall_time
from ..models import TrainResult, shard
from .fsdp import FullyShardedModel
from .sharded_optimizer import ShardedOptimizer


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


def _data_parallel_steps(model, opt, batches, steps: int, held_fn, group=None):
    """The training loop both ZeRO and FSDP2 run: this rank's slice, global mean loss, timing."""
    rank, world = group_info(group, required=True)
    dev = device()
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
            held = held_fn()
    return losses, seconds, held


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
    group_info(group, required=True)
    model, opt = shard_model(model.to(device()), stage, torch.optim.AdamW, group=group, lr=lr,
                             weight_decay=0.01)
    losses, seconds, held = _data_parallel_steps(model, opt, batches, steps,
                                                 lambda: held_bytes(model, opt), group)
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
    out = {"ours": train_sharded(make_model(), 3, batches, steps, lr, group)}
    dev = device()
    mesh = None
    if group is not None:
        mesh = DeviceMesh.from_group(group, dev.type)
    model = make_model().to(dev)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    def held():
        params = list(model.parameters())
        return {"params": tensor_bytes(local(p) for p in params),
                "grads": tensor_bytes(local(p.grad) if p.grad is not None else None
                                      for p in params),
                "optimizer": tensor_bytes(local(v) for s in opt.state.values()
                                          for v in s.values() if isinstance(v, torch.Tensor))}

    losses, seconds, held_now = _data_parallel_steps(model, opt, batches, steps, held, group)
    full = {n: local(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}
    out["fsdp2"] = {"result": TrainResult(losses, full), "held": held_now, "step_seconds": seconds}
    return out
