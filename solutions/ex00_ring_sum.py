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
    # BEGIN SOLUTION
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    total = tensor.clone()
    outgoing = tensor.clone()
    incoming = torch.empty_like(tensor)
    for _ in range(size - 1):
        request = dist.isend(outgoing, right)
        dist.recv(incoming, left)
        request.wait()
        total += incoming
        outgoing, incoming = incoming, outgoing
    return total
    # END SOLUTION
