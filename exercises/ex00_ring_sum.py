# Generated from solutions/ex00_ring_sum.py by `python -m lecture_lib.grading stubs`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grading grade exercises/ex00_ring_sum.py
"""Exercise 00: sum a tensor over all ranks using only send and recv.

Every rank holds a tensor of the same shape. Return, on every rank, a new
tensor holding the element-wise sum over all ranks. Use point-to-point
messages only (``dist.send``, ``dist.recv``, ``dist.isend``, ``dist.irecv``):
no collective such as ``all_reduce``. Do not modify the input.

Pass the values round a ring: each rank sends only to its right neighbour
(``rank + 1``, wrapping round) and receives only from its left (``rank - 1``),
``world_size - 1`` messages each, every one the size of the tensor (the tests
count each rank's messages, their peers and their bytes).

It must work for any world size, including 1 (one rank: the sum is a copy of
its own tensor). Careful: gloo cannot send a message from a rank to itself
(it fails with "Pair is not connected"), which a single rank would be doing
if it sent to its neighbour.

Hint: how many hops does a value need before every rank has seen it? If
every rank first blocks in a send that only completes once the neighbour
receives, who is left to receive? (Notebook 01, section 1, shows the way out.) A hang ends
after the test's time limit with the Python stack of every rank, which tells
you where each one was waiting. This is the pattern that ring all-reduce
refines in notebook 01.
"""
import torch
import torch.distributed as dist


def ring_sum(tensor: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("ex00: your code here")
