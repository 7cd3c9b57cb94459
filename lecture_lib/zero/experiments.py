"""What the notebooks run to measure ZeRO: training loops, bytes held, FSDP2 side by side.

:func:`shard_model` is the one entry point for stage 1, 2 or 3; :func:`build` makes every
case the measurements compare (:data:`CASES`: DDP, flat or in buckets of :data:`BUCKET_MB`,
ZeRO-1, ZeRO-2 and FSDP's variants) and
:func:`one_step` runs one step of any of them;
:func:`train_sharded` trains a model with it on this rank's share of each
batch, comparable with :func:`lecture_lib.models.train_reference`;
:func:`held_bytes` counts what a rank really holds; :func:`fsdp2_side_by_side`
runs our ZeRO-3 and torch's FSDP2 (Zhao et al. 2023) on the same model and data.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from .. import observe
from ..comm import group_info
from ..costmodel.memory import check_zero_stage
from ..data_parallel import DDPBucketed, DDPFlat
from ..metrics import state_bytes, tensor_bytes, wall_time
from ..models import TrainResult, make_optimizer, shard
from ..precision import LossScaler
from ..runtime import device
from .fsdp import FullyShardedModel
from .fsdp_api import fsdp_gather_full_params, fsdp_on_after_backward
from .sharded_optimizer import ShardedGradientOptimizer, ShardedOptimizer
from .wrap import resolve_units

BUCKET_MB = 25          # "ddp_bucketed": torch DDP's default bucket (02's best at real size)
#: Every case the measurements compare: plain data parallelism (one all-reduce after backward, or
#: bucketed), ZeRO-1 and ZeRO-2, and FSDP (ZeRO-3) with its options (default: prefetch, reshard
#: after forward).
CASES = {"ddp": None, "ddp_bucketed": None, "zero1": None, "zero2": None, "fsdp": {},
         "fsdp_no_prefetch": {"prefetch": False},
         "fsdp_keep": {"reshard_after_forward": False},
         "fsdp_keep_no_prefetch": {"reshard_after_forward": False, "prefetch": False},
         "fsdp_bf16": {"compute_dtype": torch.bfloat16}}
_OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}


def check_cases(cases) -> list[str]:
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f"unknown cases {unknown}; known: {list(CASES)}")
    return list(cases)


def build(case: str, model: nn.Module, group=None, optimizer: str = "sgd", lr: float = 1e-2):
    """``(wrapped model, optimizer)`` of one of :data:`CASES`."""
    check_cases([case])
    if case == "ddp":
        return DDPFlat(model, group), make_optimizer(model.parameters(), optimizer, lr)
    if case == "ddp_bucketed":
        return (DDPBucketed(model, BUCKET_MB, group),
                make_optimizer(model.parameters(), optimizer, lr))
    if case in ("zero1", "zero2"):
        return shard_model(model, int(case[-1]), _OPTIMIZERS[optimizer], group, lr=lr)
    model = FullyShardedModel(model, group=group, **CASES[case])
    return model, make_optimizer(model.parameters(), optimizer, lr)


def one_step(model, opt, x, y) -> torch.Tensor:
    """One training step of any case; the loss (not read: a dry run has no values).

    Tells a watcher when backward begins (``observe.note("step", phase="backward")``)."""
    opt.zero_grad(set_to_none=True)
    if isinstance(model, DDPBucketed):
        model.on_train_batch_start()
    loss = model(x, y)
    observe.note("step", phase="backward")
    loss.backward()
    if isinstance(model, FullyShardedModel):
        fsdp_on_after_backward(model, opt)
    elif isinstance(model, (DDPFlat, DDPBucketed)):
        model.finish_gradient_synchronization()
    opt.step()
    return loss.detach()


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
    if stage == 2:
        return model, ShardedGradientOptimizer(model.parameters(), optimizer_cls, group=group,
                                               **kwargs)
    return model, ShardedOptimizer(model.parameters(), optimizer_cls, group=group,
                                   gradients="local", **kwargs)


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Bytes of parameters, gradients and optimizer state this rank really holds.

    Counted from the tensors (:func:`lecture_lib.metrics.state_bytes`): for
    ZeRO-3 the model's parameters are its shards; ZeRO-2's shard gradients are
    added (ZeRO-1's shards are views of the parameters, not counted twice).
    """
    held = state_bytes(model, optimizer)
    if isinstance(optimizer, ShardedGradientOptimizer):     # kept from backward to zero_grad
        held["grads"] += tensor_bytes(shard.grad for shard in optimizer.shards.values())
    return held


def peak_gathered_bytes(notes) -> int:
    """The most full-weight bytes FSDP held at once, replayed from what its units told a
    watcher (``seen.notes("fsdp")``: a unit's ``"full"`` adds its bytes, ``"free"`` drops them)."""
    held, peak = {}, 0
    for note in notes:
        if note["event"] == "full":
            held[note["unit"]] = note["nbytes"]
            peak = max(peak, sum(held.values()))
        elif note["event"] == "free":
            held.pop(note["unit"], None)
    return peak


def data_parallel_steps(model, opt, batches, steps: int, held_fn=None, group=None,
                        scaler: LossScaler | None = None):
    """The loop ZeRO, FSDP and FSDP2 all run: this rank's slice, global mean loss, timing.

    With a ``scaler`` (fp16), the loss is scaled, the gradients unscaled and the
    step skipped on every rank when any rank saw an overflow. Returns the losses, each
    step's seconds, ``held_fn()`` after the last step and the peak of full weights FSDP
    gathered in the last step (:func:`peak_gathered_bytes`; 0 for another model).
    """
    rank, world = group_info(group, required=True)
    dev = device()
    losses, seconds, held = [], [], None
    for step in range(steps):
        x, y = (t.to(dev) for t in shard(batches(step), rank, world))
        last = step == steps - 1
        with wall_time(dev) as t, (observe.watch() if last else nullcontext()) as seen:
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
        if last and held_fn is not None:
            held = held_fn()
    peak = peak_gathered_bytes(seen.notes("fsdp")) if steps else 0
    return losses, seconds, held, peak


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
    losses, seconds, held, peak = data_parallel_steps(model, opt, batches, steps,
                                                      lambda: held_bytes(model, opt), group)
    if isinstance(model, FullyShardedModel):
        params = fsdp_gather_full_params(model)
    else:
        params, peak = {k: v.detach().clone() for k, v in model.named_parameters()}, None
    return {"result": TrainResult(losses, params), "held": held, "step_seconds": seconds,
            "peak_gathered_bytes": peak}


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
    losses, seconds, held, peak = data_parallel_steps(model, opt, batches, steps,
                                                      lambda: held_bytes(model, opt), group,
                                                      scaler)
    return {"result": TrainResult(losses, fsdp_gather_full_params(model)), "held": held,
            "step_seconds": seconds, "peak_gathered_bytes": peak,
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

    losses, seconds, held_now, _ = data_parallel_steps(model, opt, batches, steps, held, group)
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
