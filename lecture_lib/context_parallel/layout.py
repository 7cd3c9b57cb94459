"""How the sequence is split across the cp ranks: contiguous or zig-zag.

With context parallelism every rank holds ``seq_len / cp`` tokens of every
sequence, for every layer. Cut the sequence into equal *chunks*:

* **contiguous**: ``cp`` chunks, rank ``r`` holds chunk ``r``. Under a causal
  mask the last rank's queries see every key and the first rank's see only
  their own: rank ``r`` does ``2r + 1`` half-blocks of work out of ``2cp - 1``
  for the last rank, a ``(2cp - 1) : 1`` imbalance.
* **zig-zag** (load-balanced; Brandon et al. 2023, "Striped Attention", and
  the zig-zag variant of Megatron-Core / Llama 3, Dubey et al. 2024,
  section 3.3.2): ``2 cp`` chunks, rank ``r`` holds chunks ``r`` and
  ``2cp - 1 - r``, an early and a late one, so every rank does the same causal
  work. It needs ``seq_len`` divisible by ``2 cp``.

Everything here is arithmetic on indices, usable before any process starts.
"""
from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag")


def check_layout_name(layout: str) -> None:
    """A clear ValueError unless ``layout`` is one of :data:`LAYOUTS`."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")


def check_layout(seq_len: int, cp: int, layout: str = "zigzag") -> None:
    """A clear ValueError unless ``seq_len`` splits into the layout's equal chunks."""
    check_layout_name(layout)
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp must be a whole number >= 1, not {cp!r}")
    parts = num_chunks(cp, layout)
    if seq_len % parts:
        raise ValueError(f"sequence length {seq_len} is not divisible by {parts} "
                         f"({'2 x ' if layout == 'zigzag' else ''}cp={cp}): the {layout} "
                         f"layout cuts the sequence into {parts} equal chunks")


def check_slice_tokens(tokens: int, layout: str = "zigzag") -> None:
    """A clear ValueError unless one rank's slice of ``tokens`` tokens fits the layout.

    Contiguous: one chunk per rank, at least one token. Zig-zag: two equal
    chunks per rank (an early and a late one), so an even number, at least 2.
    """
    check_layout_name(layout)
    if layout == "zigzag" and (tokens % 2 or tokens < 2):
        raise ValueError(f"the zigzag layout holds two equal chunks per rank, so it needs an even "
                         f"number of tokens per rank (at least 2), not {tokens}")
    if tokens < 1:
        raise ValueError(f"the contiguous layout needs at least 1 token per rank, not {tokens}")


def num_chunks(cp: int, layout: str) -> int:
    return 2 * cp if layout == "zigzag" else cp


def rank_chunks(rank: int, cp: int, layout: str = "zigzag") -> list[int]:
    """The chunk indices rank ``rank`` holds, in the order it stores them."""
    return [rank, 2 * cp - 1 - rank] if layout == "zigzag" else [rank]


def positions(rank: int, cp: int, seq_len: int, layout: str = "zigzag") -> torch.Tensor:
    """Global token positions of rank ``rank``'s slice, in its storage order."""
    check_layout(seq_len, cp, layout)
    size = seq_len // num_chunks(cp, layout)
    chunks = rank_chunks(rank, cp, layout)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks])


def shard_sequence(x: torch.Tensor, rank: int, cp: int, layout: str = "zigzag",
                   dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s slice of ``x`` along the sequence dimension ``dim``."""
    return x.index_select(dim, positions(rank, cp, x.shape[dim], layout).to(x.device))


def unshard_sequence(parts: list[torch.Tensor], layout: str = "zigzag",
                     dim: int = 1) -> torch.Tensor:
    """The full sequence back from every rank's slice (``parts`` in rank order)."""
    cp = len(parts)
    seq_len = sum(p.shape[dim] for p in parts)
    order = torch.cat([positions(r, cp, seq_len, layout) for r in range(cp)])
    full = torch.cat(parts, dim)
    return full.index_select(dim, torch.argsort(order).to(full.device))
