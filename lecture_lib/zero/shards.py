"""How ZeRO cuts a tensor into N shards, and packs many tensors into one collective.

Each parameter is flattened and split into N equal chunks of ``ceil(numel / N)``
elements, rank r owning the r-th; the last chunk is padded with zeros when N does
not divide the size, as FSDP2 does along dim 0 (Rajbhandari et al. 2020). Every
stage of ZeRO cuts the same way, so the arithmetic lives here once.

One collective moves many tensors: rank r's chunk of every tensor, side by side,
then rank r + 1's (the layout an all-gather returns and a reduce-scatter takes)::

    tensors  a = [a0 a1 | a2 a3]   b = [b0 | b1]        (N = 2 ranks)
    packed   [a0 a1 b0 | a2 a3 b1]                      rank 0's chunks | rank 1's

:func:`pack` and :func:`unpack` move between the two, one kernel each, whatever the
number of tensors (the two copy operations FSDP2 uses for the same job).
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


def pack(tensors, world_size: int) -> torch.Tensor:
    """One flat buffer for a reduce-scatter: chunk 0 of every tensor, then chunk 1, ...
    (``torch._chunk_cat`` pads and interleaves in one kernel)."""
    flat = [t.reshape(-1) for t in tensors]
    return torch._chunk_cat(flat, dim=0, num_chunks=world_size).view(-1)


def unpack(gathered: torch.Tensor, outs, world_size: int) -> None:
    """Copy an all-gather's ``gathered`` (chunk 0 of every tensor, then chunk 1, ...) into the
    padded flat tensors ``outs`` (``world_size x chunk`` elements each), one kernel."""
    chunks = [o.numel() // world_size for o in outs]
    torch.split_with_sizes_copy(gathered.view(world_size, -1), chunks, dim=1,
                                out=[o.view(world_size, c) for o, c in zip(outs, chunks)])


def check_enough_elements(params, world_size: int) -> None:
    """Refuse a model with fewer elements than ranks: some rank would own nothing."""
    total = sum(p.numel() for p in params)
    if total < world_size:
        raise ValueError(f"more ranks ({world_size}) than parameter elements to shard ({total}): "
                         "some rank would own nothing")
