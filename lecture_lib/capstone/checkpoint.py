"""Checkpoints of the capstone: sharded, resumable bit-exactly, and reshardable.

``torch.distributed.checkpoint`` (DCP) saves a *state dict* whose tensors may be
``DTensor`` s: each rank writes only its own pieces together with where they sit
in the full tensor, and on load each rank reads the boxes its own layout needs,
whatever layout wrote them. That is how a run saved by FSDP on 4 ranks resumes
as tensor parallelism on 2 (Wang et al. 2024, "TorchTitan", section 3.3;
Mohan et al. 2021, "CheckFreq" for why checkpoints must be frequent and cheap).

What this module saves, every tensor under its *canonical* name (the
one-process GPT's, :meth:`.strategies.Plan.entries`):

* the model's parameters and the AdamW state of each (``optim.<name>.exp_avg``,
  ``exp_avg_sq``, ``step``);
* a tensor-parallel slice as a ``DTensor`` sharded along its split dimension
  over the tp sub-mesh; a replicated tensor as a plain tensor (DCP writes one
  copy of equal keys);
* ZeRO's flat shards (FSDP's parameters and their optimizer state, ZeRO-1/2's
  optimizer state) as a ``DTensor`` sharded along dim 0 over the dp sub-mesh
  when the flat cut falls on whole rows (dim 0 divisible by the dp size); when it
  does not, the flat shards do not align with any dimension, so they are
  **all-gathered into the full tensor before saving** (and each rank takes its
  flat slice back on load);
* in ``capstone.json`` beside DCP's files, written by rank 0 once every rank has
  saved (so a checkpoint without it is incomplete and ignored): the step, the
  model configuration (a checkpoint of another model is refused), the loader's
  position and the strategy and grid that wrote it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor, Shard

from ..comm import all_gather_into
from ..models import GPTConfig
from ..zero.shards import chunk_size, shard_bounds

META = "capstone.json"


def step_dir(root, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def latest_checkpoint(root) -> Path | None:
    """The complete checkpoint (one with ``capstone.json``) of the highest step, or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    done = [d for d in root.glob("step_*") if (d / META).is_file()]
    return max(done, key=lambda d: int(d.name.split("_")[1]), default=None)


def read_meta(path) -> dict:
    return json.loads((Path(path) / META).read_text())


def check_same_model(meta: dict, model: GPTConfig, where) -> None:
    """A clear ValueError when a checkpoint was written for another model configuration."""
    saved = meta["model"]
    want = dataclasses.asdict(model)
    if saved != want:
        diff = ", ".join(f"{k}={saved.get(k)} (this run {want[k]})" for k in want
                         if saved.get(k) != want[k])
        raise ValueError(f"the checkpoint in {where} is of another model: {diff}; "
                         "use another --checkpoint-dir or the same model")


# ----------------------------------------------------------------------------
# One entry: what DCP sees, and how a loaded value goes back
# ----------------------------------------------------------------------------

def _flat_aligned(shape: tuple, n: int) -> bool:
    """Does ZeRO's flat cut over ``n`` ranks fall on whole rows of a tensor of ``shape``?"""
    return len(shape) > 0 and shape[0] % n == 0


def _as_saved(e, plan, loading: bool):
    """``(value for DCP, restore)``: ``restore()`` copies a loaded value into the rank's tensor."""
    if e.kind == "full":
        return e.tensor, lambda: None                     # DCP loads in place
    if e.kind == "tp":
        dt = DTensor.from_local(e.tensor, plan.grid.mesh["tp"], [Shard(e.dim)], run_check=False)
        return dt, lambda: _copy_if_needed(e.tensor, dt.to_local())
    n, r = plan.grid.size("dp"), plan.grid.coord("dp")
    numel = int(torch.Size(e.shape).numel())
    _, lo, hi = shard_bounds(numel, r, n)
    if _flat_aligned(e.shape, n):
        rows = e.tensor[:hi - lo].view((e.shape[0] // n,) + tuple(e.shape[1:]))
        dt = DTensor.from_local(rows, plan.grid.mesh["dp"], [Shard(0)], run_check=False)
        return dt, lambda: _copy_if_needed(rows, dt.to_local())
    if loading:
        full = torch.zeros(e.shape, dtype=e.tensor.dtype, device=e.tensor.device)
    else:
        full = _gather_flat(e.tensor[:hi - lo], numel, e.shape, plan)
    return full, lambda: e.tensor[:hi - lo].copy_(full.reshape(-1)[lo:hi])


def _gather_flat(mine: torch.Tensor, numel: int, shape: tuple, plan) -> torch.Tensor:
    """Every dp rank's flat slice, all-gathered into the full tensor."""
    n = plan.grid.size("dp")
    chunk = chunk_size(numel, n)
    padded = torch.zeros(chunk, dtype=mine.dtype, device=mine.device)
    padded[:mine.numel()].copy_(mine)
    out = torch.empty(chunk * n, dtype=mine.dtype, device=mine.device)
    all_gather_into(out, padded, plan.dp_group, phase="checkpoint")
    return out[:numel].view(shape)


def _copy_if_needed(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.data_ptr() != src.data_ptr():
        dst.copy_(src)


# ----------------------------------------------------------------------------
# Save and load
# ----------------------------------------------------------------------------

def save(root, step: int, plan, loader, meta: dict) -> Path:
    """Every rank: write the plan's state and the loader's position as checkpoint ``step``."""
    path = step_dir(root, step)
    with torch.no_grad():
        state = {e.key: _as_saved(e, plan, loading=False)[0] for e in plan.entries()}
    dcp.save(state, checkpoint_id=str(path))
    if dist.get_rank() == 0:
        info = dict(meta, step=step, loader=loader.state_dict(),
                    model=dataclasses.asdict(plan.cfg))
        tmp = path / (META + ".tmp")
        tmp.write_text(json.dumps(info, indent=1))
        os.replace(tmp, path / META)                     # complete only now
    dist.barrier()
    return path


def load(path, plan, loader) -> dict:
    """Every rank: load checkpoint ``path`` into the plan (any layout) and the loader."""
    meta = read_meta(path)
    check_same_model(meta, plan.cfg, path)
    with torch.no_grad():
        pairs = {e.key: _as_saved(e, plan, loading=True)
                 for e in plan.entries(init_optimizer=True)}
        state = {k: v for k, (v, _) in pairs.items()}
        dcp.load(state, checkpoint_id=str(path))
        for _, restore in pairs.values():
            restore()
    loader.load_state_dict(meta["loader"])
    return meta

