# Generated from solutions/ex01_ring_allreduce.py by `python -m lecture_lib.exercises`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grade exercises/ex01_ring_allreduce.py
"""Exercise 01: ring all-reduce = ring reduce-scatter, then ring all-gather.

Every rank holds a tensor of the same shape. ``ring_all_reduce(tensor)``
returns, on every rank, a new tensor with the element-wise sum over all ranks
(the input stays unchanged), using point-to-point messages only
(``dist.isend``/``dist.irecv``/``dist.send``/``dist.recv``; no collective).

Cut the flattened tensor into ``world_size`` chunks (``torch.tensor_split``
gives chunks whose sizes differ by at most one, so any size works), then:

1. ``reduce_scatter_(chunks)``: ``world_size - 1`` steps. In step ``s`` rank
   ``r`` sends chunk ``(r - s - 1) % p`` to its right neighbour ``r + 1`` and
   receives chunk ``(r - s - 2) % p`` from its left neighbour ``r - 1``, adding
   what arrives to its own copy of that chunk. Afterwards ``chunks[r]`` on rank
   ``r`` holds the sum over all ranks of chunk ``r``.
2. ``all_gather_(chunks)``: ``world_size - 1`` steps. In step ``s`` rank ``r``
   sends chunk ``(r - s) % p`` to the right and receives chunk ``(r - s - 1) % p``
   from the left, overwriting its copy. Afterwards every chunk is the full sum.

Both work in place on the list of chunks (views of one flat buffer). Post each
send with ``isend`` before the matching receive so no rank waits for another
to receive first, and skip empty chunks (a tensor with fewer elements than ranks).
Notebook 01 draws the chunks moving round the ring step by step.
"""
import torch
import torch.distributed as dist


def reduce_scatter_(chunks: list) -> None:
    raise NotImplementedError("ex01: your code here")


def all_gather_(chunks: list) -> None:
    raise NotImplementedError("ex01: your code here")


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("ex01: your code here")
