# Generated from solutions/ex00_ring_sum.py by `python -m lecture_lib.exercises`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grade exercises/ex00_ring_sum.py
"""Exercise 00: sum a tensor over all ranks using only send and recv.

Every rank holds a tensor of the same shape. Return, on every rank, a new
tensor holding the element-wise sum over all ranks. Use point-to-point
messages only (``dist.send``, ``dist.recv``, ``dist.isend``, ``dist.irecv``):
no collective such as ``all_reduce``. Do not modify the input.

Hint: arrange the ranks in a ring. In each of ``world_size - 1`` steps, pass
the tensor you received last to your right neighbour while receiving a new
one from your left neighbour, and add it to your running total. Posting the
send as ``isend`` before the blocking ``recv`` keeps every rank from waiting
on the others (a deadlock). This is the pattern that ring all-reduce refines
in notebook 01.
"""
import torch
import torch.distributed as dist


def ring_sum(tensor: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("ex00: your code here")
