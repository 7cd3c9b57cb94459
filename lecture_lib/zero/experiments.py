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
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ..comm import group_info
from ..costmodel.memory import check_zero_stage
from ..metrics import state_bytes, tensor_bytes, wall_time
from ..models import TrainResult, make_optimizer, shard
from ..precision import LossScaler
from ..runtime import device
from .fsdp import FullyShardedModel
from .fsdp_api import fsdp_gather_full_params, fsdp_on_after_backward
from .sharded_optimizer import ShardedOptimizer
from .units import resolve_units


def shard_model(model: nn.Module, stage: int, optimizer_cls=torch.optim.AdamW, group=None,
                **kwargs):
    """``(model, optimizer)`` for ZeRO ``stage`` 1, 2 or 3 over ``group``."""
    stage = check_zero_stage(stage)
    if stage == 0:
        raise ValueError("ZeRO stage 0 is plain data parallelism (lecture_lib.data_parallel); "
                         "shard_model takes stage 1, 2 or 3")
    if stage == 3:
        sharded = FullyShardedModel(model, group=group)
        return sharded, optimizer_cls(sharded.parameters(), **kwargs)
    mode = "all_reduce" if stage == 1 else "reduce_scatter"
    return model, ShardedOptimizer(model.parameters(), optimizer_cls, group=group,
                                   gradients=mode, **kwargs)


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Bytes of parameters, gradients and optimizer state this rank really holds.

    Counted from the tensors (:func:`lecture_lib.metrics.state_bytes`): for
    ZeRO-3 the model's parameters are its shards; ZeRO-2's shard gradients are
    added (ZeRO-1's shards are views of the parameters, not counted twice).
    """
    held = state_bytes(model, optimizer)
    if isinstance(optimizer, ShardedOptimizer):
        held["grads"] += optimizer.shard_grad_bytes()
    return held


def data_parallel_steps(model, opt, batches, steps: int, held_fn=None, group=None,
                        scaler: LossScaler | None = None):
    """The loop ZeRO, FSDP and FSDP2 all run: this rank's slice, global mean loss, timing.

    With a ``scaler`` (fp16), the loss is scaled, the gradients unscaled and the
    step skipped on every rank when any rank saw an overflow.
    """
    rank, world = group_info(group, required=True)
    dev = device()
    losses, seconds, held = [], [], None
    for step in range(steps):
        x, y = (t.to(dev) for t in shard(batches(step), rank, world))
        with wall_time(dev) as t:
            opt.zero_grad(set_to_none=True)
            loss = model(x, y)
            (loss.float() * (scaler.scale if scaler else 1.0)).backward()
            if isinstance(model, FullyShardedModel):
                fsdp_on_after_backward(model, opt)
            if scaler is None or _all_finite(scaler, model, group):
                opt.step()
        seconds.append(t.seconds)
        total = loss.detach().float().clone()
        dist.all_reduce(total, group=group)
        losses.append(total.item() / world)
        if step == steps - 1 and held_fn is not None:
            held = held_fn()
    return losses, seconds, held


def _all_finite(scaler: LossScaler, model, group) -> bool:
    """Unscale this rank's gradients; finite only if every rank's are (one flag all-reduced)."""
    ok = torch.tensor([float(scaler.unscale_(model.parameters()))], device=device())
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    scaler.update(bool(ok.item()))
    return bool(ok.item())


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
    losses, seconds, held = data_parallel_steps(model, opt, batches, steps,
                                                lambda: held_bytes(model, opt), group)
    if isinstance(model, FullyShardedModel):
        params = fsdp_gather_full_params(model)
    else:
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return {"result": TrainResult(losses, params), "held": held, "step_seconds": seconds,
            "peak_gathered_bytes": getattr(model, "peak_gathered_bytes", None)}


def train_fsdp(make_model, batches, steps: int, lr: float = 1e-2, optimizer: str = "adamw",
               group=None, **fsdp_kwargs) -> dict:
    """Rank function: train ``make_model()`` under :class:`FullyShardedModel` (``fsdp_kwargs``).

    The optimizer is built the usual way, on ``model.parameters()``. fp16
    compute gets dynamic loss scaling (:class:`lecture_lib.precision.LossScaler`).
    Returns ``result``, ``held``, ``step_seconds``, ``peak_gathered_bytes``.
    """
    model = FullyShardedModel(make_model().to(device()), group=group, **fsdp_kwargs)
    opt = make_optimizer(model.parameters(), optimizer, lr)
    scaler = LossScaler("fp16") if model.compute_dtype == torch.float16 else None
    losses, seconds, held = data_parallel_steps(model, opt, batches, steps,
                                                lambda: held_bytes(model, opt), group, scaler)
    return {"result": TrainResult(losses, fsdp_gather_full_params(model)), "held": held,
            "step_seconds": seconds, "peak_gathered_bytes": model.peak_gathered_bytes,
            "skipped": scaler.skipped if scaler else 0}


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def train_fsdp2(make_model, batches, steps: int, lr: float = 1e-2, optimizer: str = "adamw",
                group=None, compute_dtype=None) -> dict:
    """Rank function: torch FSDP2 with the same units as our default policy, the same loop."""
    dev = device()
    mesh = None if group is None else DeviceMesh.from_group(group, dev.type)
    model = make_model().to(dev)
    mp = MixedPrecisionPolicy() if compute_dtype is None else \
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=compute_dtype)
    for _, unit in resolve_units(model):
        fully_shard(unit, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = make_optimizer(model.parameters(), optimizer, lr)

    def held():
        params = list(model.parameters())
        return {"params": tensor_bytes(_local(p) for p in params),
                "grads": tensor_bytes(_local(p.grad) if p.grad is not None else None
                                      for p in params),
                "optimizer": tensor_bytes(_local(v) for s in opt.state.values()
                                          for v in s.values() if isinstance(v, torch.Tensor))}

    losses, seconds, held_now = data_parallel_steps(model, opt, batches, steps, held, group)
    full = {n: _local(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}
    return {"result": TrainResult(losses, full), "held": held_now, "step_seconds": seconds}


def fsdp2_side_by_side(make_model, batches, steps: int, lr: float = 1e-2, group=None,
                       compute_dtype=None, optimizer: str = "adamw") -> dict:
    """Rank function: our FSDP and torch FSDP2 on the same model, units and data, in one run.

    Returns, for ``"ours"`` and ``"fsdp2"``: ``result``, ``held`` (bytes this
    rank holds; FSDP2's DTensors counted by their local shards) and
    ``step_seconds`` (real time on this machine).
    """
    return {"ours": train_fsdp(make_model, batches, steps, lr, optimizer, group,
                               compute_dtype=compute_dtype),
            "fsdp2": train_fsdp2(make_model, batches, steps, lr, optimizer, group, compute_dtype)}
