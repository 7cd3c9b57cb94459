"""How ZeRO cuts one tensor into N shards (Rajbhandari et al. 2020).

Each parameter is flattened and split into N equal chunks of
``ceil(numel / N)`` elements, rank r owning the r-th; the last chunk is padded
with zeros when N does not divide the size, as FSDP2 does along dim 0. Every
stage of ZeRO (the sharded optimizer and the fully sharded model) cuts the
same way, so the arithmetic lives here once.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def chunk_size(numel: int, world_size: int) -> int:
    """Elements in one rank's (padded) shard of a tensor of ``numel`` elements."""
    return math.ceil(numel / world_size)


def shard_bounds(numel: int, rank: int, world_size: int) -> tuple[int, int, int]:
    """``(chunk, lo, hi)``: rank's slice ``[lo, hi)`` of the flat tensor (``hi - lo <= chunk``)."""
    chunk = chunk_size(numel, world_size)
    lo = min(rank * chunk, numel)
    return chunk, lo, min(lo + chunk, numel)


def padded_flat(t: torch.Tensor, world_size: int) -> torch.Tensor:
    """``t`` flattened and zero-padded to ``world_size x chunk`` elements."""
    flat = t.reshape(-1)
    return F.pad(flat, (0, chunk_size(flat.numel(), world_size) * world_size - flat.numel()))


def check_enough_elements(params, world_size: int) -> None:
    """Refuse a model with fewer elements than ranks: some rank would own nothing."""
    total = sum(p.numel() for p in params)
    if total < world_size:
        raise ValueError(f"more ranks ({world_size}) than parameter elements to shard ({total}): "
                         "some rank would own nothing")
