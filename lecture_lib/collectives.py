"""Collectives built from point-to-point messages.

Data parallel training averages gradients with an *all-reduce*: every rank
ends with the sum (or mean) of every rank's tensor. The bandwidth-optimal way
to do it on ``p`` ranks is the *ring* (Patarasuk & Yuan 2009, "Bandwidth
optimal all-reduce algorithms for clusters of workstations"; Baidu's "ring
all-reduce", 2017): cut the buffer into ``p`` chunks, then

1. **reduce-scatter**: in ``p - 1`` steps each rank passes one chunk to its
   right neighbour and adds the chunk arriving from its left one; afterwards
   rank ``r`` holds the full sum of chunk ``r``;
2. **all-gather**: in ``p - 1`` more steps the summed chunks travel round the
   ring until every rank holds all of them.

Reduce-scatter on 3 ranks, chunks a, b, c (``b_2`` is chunk b of rank 2); each rank
sends one chunk right and adds the one arriving from its left::

             rank 0             rank 1             rank 2
    step 0   sends c_0          sends a_1          sends b_2
    step 1   sends b_2+b_0      sends c_0+c_1      sends a_1+a_2
    after    a_0+a_1+a_2        b_0+b_1+b_2        c_0+c_1+c_2

Each rank sends ``2 (p - 1) / p`` of the buffer in total (both phases), whatever ``p``
is: the "bus factor" of :func:`lecture_lib.costmodel.bus_factor`. The naive
alternative (everybody sends to one root, the root sends the sum back) makes the
root move ``2 (p - 1)`` whole buffers.

Everything here works on any process group (``group=None`` is the default group),
for any tensor size (chunks differ by at most one element when the size is not
divisible by ``p``), and reduces with ``op="sum"`` or ``"avg"``. The benchmark
that times these against torch's is :mod:`lecture_lib.bandwidth`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import group_info
from .runtime import device

OPS = ("sum", "avg")


# ----------------------------------------------------------------------------
# The collectives
# ----------------------------------------------------------------------------

def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None,
                    trace: list | None = None) -> torch.Tensor:
    """All-reduce ``tensor`` **in place** (like ``dist.all_reduce``) as ring reduce-scatter
    followed by ring all-gather; returns ``tensor``.

    With a list as ``trace``, each step appends ``(phase, step, chunk sent, chunk
    received, copies of every chunk after the step)``: what notebook 01 draws.
    """
    rank, size, ranks = _ring(tensor, group, op)
    if size == 1:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
    chunks = list(flat.split(chunk_sizes(flat.numel(), size)))
    _reduce_scatter_chunks(chunks, rank, size, ranks, group, trace)
    if op == "avg":
        chunks[rank].div_(size)
    _all_gather_chunks(chunks, rank, size, ranks, group, trace)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def ring_reduce_scatter(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """Reduce ``tensor`` over the group; return this rank's chunk of the flattened result.

    Chunk ``r`` (1-D) has ``chunk_sizes(tensor.numel(), p)[r]`` elements. The
    input is not modified.
    """
    rank, size, ranks = _ring(tensor, group, op)
    flat = tensor.detach().reshape(-1).clone()
    chunks = list(flat.split(chunk_sizes(flat.numel(), size)))
    _reduce_scatter_chunks(chunks, rank, size, ranks, group)
    mine = chunks[rank].clone()
    return mine.div_(size) if op == "avg" else mine


def ring_all_gather(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` (same shape everywhere) along dim 0, in rank order."""
    rank, size, ranks = _ring(tensor, group)
    flat = tensor.detach().reshape(-1)
    out = torch.empty(size * flat.numel(), dtype=tensor.dtype, device=tensor.device)
    chunks = list(out.split(flat.numel())) if flat.numel() else [out] * size
    chunks[rank].copy_(flat)
    _all_gather_chunks(chunks, rank, size, ranks, group)
    shape = (size * tensor.shape[0], *tensor.shape[1:]) if tensor.dim() else (size,)
    return out.view(shape)


def naive_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None,
                     root: int = 0) -> torch.Tensor:
    """All-reduce in place the naive way: every rank sends to ``root`` (a group rank), the
    root adds and sends the result back to each rank. The root moves ``2 (p - 1)`` buffers."""
    rank, size, ranks = _ring(tensor, group, op)
    if not 0 <= root < size:
        raise ValueError(f"root must be a rank of the group (0..{size - 1}), not {root}")
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
    if rank == root:
        incoming = torch.empty_like(flat)
        for r in range(size):
            if r != root:
                dist.recv(incoming, ranks[r], group)
                flat += incoming
        if op == "avg":
            flat.div_(size)
        requests = [dist.isend(flat, ranks[r], group) for r in range(size) if r != root]
        for request in requests:
            request.wait()
    elif size > 1:
        dist.send(flat, ranks[root], group)
        dist.recv(flat, ranks[root], group)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def all_to_all(chunks: list[torch.Tensor], group=None) -> list[torch.Tensor]:
    """``out[j]`` on rank ``r`` is ``chunks[r]`` of rank ``j``: a transpose across ranks.

    ``chunks`` holds one tensor per rank of the group, all of one shape and
    dtype (the same on every rank). Pairwise exchange: in step ``s`` rank ``r``
    sends to ``r + s`` and receives from ``r - s``.
    """
    if not isinstance(chunks, (list, tuple)) or not chunks:
        raise TypeError("chunks must be a non-empty list of tensors, one per rank")
    rank, size, ranks = _ring(chunks[0], group)
    if len(chunks) != size:
        raise ValueError(f"need one chunk per rank of the group ({size}), got {len(chunks)}")
    for c in chunks:
        if c.shape != chunks[0].shape or c.dtype != chunks[0].dtype or c.device != chunks[0].device:
            raise ValueError("every chunk must have the same shape, dtype and device")
    out = [None] * size
    out[rank] = chunks[rank].detach().clone()
    for step in range(1, size):
        dst, src = (rank + step) % size, (rank - step) % size
        out[src] = torch.empty_like(chunks[0])
        _exchange(chunks[dst].detach().contiguous(), ranks[dst], out[src], ranks[src], group)
    return out


# ----------------------------------------------------------------------------
# Helpers: the ring's steps, the exchange, the checks
# ----------------------------------------------------------------------------

def _ring(tensor: torch.Tensor, group, op: str | None = None) -> tuple[int, int, list[int]]:
    """This rank's position, the group size and the group's global ranks; clear errors first."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, not {type(tensor).__name__}")
    if op is not None and op not in OPS:
        raise ValueError(f"op must be one of {OPS}, not {op!r}")
    if op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"op='avg' needs a floating-point tensor, not {tensor.dtype}")
    rank, size = group_info(group, required=True)
    if tensor.device != device():
        raise ValueError(f"tensor is on {tensor.device} but this rank's device is {device()} "
                         "(move it with .to(lecture_lib.device()))")
    if rank < 0:
        raise ValueError(f"global rank {dist.get_rank()} is not a member of the group "
                         f"{dist.get_process_group_ranks(group)}")
    return rank, size, dist.get_process_group_ranks(group or dist.group.WORLD)


def chunk_sizes(numel: int, parts: int) -> list[int]:
    """Sizes of ``parts`` chunks covering ``numel`` elements; the first ``numel % parts``
    get one more."""
    base, extra = divmod(numel, parts)
    return [base + (i < extra) for i in range(parts)]


def _exchange(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, group) -> None:
    """Send to ``dst`` while receiving from ``src`` (global ranks); both sides skip empty chunks."""
    ops = []
    if send.numel():
        ops.append(dist.P2POp(dist.isend, send, dst, group))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, src, group))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()


def _reduce_scatter_chunks(chunks: list[torch.Tensor], rank: int, size: int, ranks: list[int],
                           group, trace=None) -> None:
    """Ring reduce-scatter in place: afterwards ``chunks[rank]`` holds the sum over the group."""
    right, left = ranks[(rank + 1) % size], ranks[(rank - 1) % size]
    # one receive buffer for the whole ring, reused at every step (a chunk arrives, is added)
    scratch = chunks[0].new_empty(max(c.numel() for c in chunks))
    for step in range(size - 1):
        out, into = (rank - step - 1) % size, (rank - step - 2) % size
        incoming = scratch[:chunks[into].numel()]
        _exchange(chunks[out], right, incoming, left, group)
        chunks[into] += incoming
        if trace is not None:
            trace.append(("reduce-scatter", step, out, into, [c.clone() for c in chunks]))


def _all_gather_chunks(chunks: list[torch.Tensor], rank: int, size: int, ranks: list[int],
                       group, trace=None) -> None:
    """Ring all-gather in place: ``chunks[rank]`` is ours; afterwards every chunk is filled."""
    right, left = ranks[(rank + 1) % size], ranks[(rank - 1) % size]
    for step in range(size - 1):
        out, into = (rank - step) % size, (rank - step - 1) % size
        _exchange(chunks[out], right, chunks[into], left, group)
        if trace is not None:
            trace.append(("all-gather", step, out, into, [c.clone() for c in chunks]))
