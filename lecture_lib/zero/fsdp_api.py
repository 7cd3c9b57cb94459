"""FSDP's interface as students meet it: CS336 (2026) helpers, full weights, checkpoints.

Stanford CS336's 2026 systems assignment has students write FSDP behind three
calls, reproduced here over :class:`~lecture_lib.zero.fsdp.FullyShardedModel`:
``get_fsdp(module, compute_dtype)``, ``fsdp_on_after_backward(model, optimizer)``
and ``fsdp_gather_full_params(model) -> {name: full tensor}``.

Checkpoints are *plain per-rank state dicts*: since the module's parameters
are the local shards, ``model.module.state_dict()`` already is this rank's
sharded state, and each rank saves its own file (``rank<r>.pt``) with the
optimizer's state for its shards. ``torch.distributed.checkpoint`` would
need DTensors to know how the pieces fit (FSDP2's parameters); with plain
tensors it would see every rank's ``"head.weight"`` as one replicated
tensor. To change the world size, gather the full weights
(:func:`fsdp_gather_full_params`), load them into an unwrapped module and wrap
it again.
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn

from ..comm import all_gather_into
from .fsdp import FullyShardedModel


def get_fsdp(module: nn.Module, compute_dtype: torch.dtype | None = None,
             **kwargs) -> FullyShardedModel:
    """CS336's entry point: ``module`` wrapped for FSDP (the default wrap policy)."""
    return FullyShardedModel(module, compute_dtype=compute_dtype, **kwargs)


def fsdp_on_after_backward(model: FullyShardedModel, optimizer=None) -> None:
    """Called between ``loss.backward()`` and ``optimizer.step()`` (CS336's interface).

    Waits for every reduce-scatter and the replicated all-reduce. Our end-of-
    backward callback has already waited, so here it only checks that it did.
    """
    if not model.finish_gradients():
        raise RuntimeError("FSDP gradients are still in flight after backward")


@torch.no_grad()
def fsdp_gather_full_params(model: FullyShardedModel) -> dict[str, torch.Tensor]:
    """``{name: full tensor}`` of the wrapped module, in its dtype, on every rank."""
    slot_of = {ps.shard: ps for unit in model.units() for ps in unit.params}
    out = {}
    for name, p in model.module.named_parameters():
        ps = slot_of.get(p)
        if ps is None:                                    # replicated: already whole
            out[name] = p.detach().clone()
            continue
        full = torch.empty(ps.chunk * model.world_size, dtype=p.dtype, device=p.device)
        all_gather_into(full, p.detach(), model.group, phase="checkpoint")
        out[name] = full[:ps.numel].view(ps.shape).clone()
    return out


def save_sharded(model: FullyShardedModel, optimizer, folder: str) -> str:
    """Each rank writes its shards and its optimizer state to ``folder/rank<r>.pt``."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank{model.rank}.pt")
    state = {"world_size": model.world_size, "model": model.module.state_dict(),
             "optimizer": optimizer.state_dict() if optimizer is not None else None}
    torch.save(state, path)
    return path


def load_sharded(model: FullyShardedModel, optimizer, folder: str) -> None:
    """Load what :func:`save_sharded` wrote, on the same number of ranks."""
    state = torch.load(os.path.join(folder, f"rank{model.rank}.pt"), weights_only=True)
    if state["world_size"] != model.world_size:
        raise ValueError(f"checkpoint written by {state['world_size']} ranks, loading on "
                         f"{model.world_size}: gather the full parameters to reshard")
    model.module.load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
