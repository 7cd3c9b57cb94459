"""Exercise 01: ring all-reduce = ring reduce-scatter, then ring all-gather.

Every rank holds a tensor of the same shape. ``ring_all_reduce(tensor)``
returns, on every rank, a new tensor with the element-wise sum over all ranks
(the input stays unchanged), using point-to-point messages only
(``dist.isend``/``dist.irecv``/``dist.send``/``dist.recv``; no collective).

Cut the flattened tensor into ``world_size`` chunks (``torch.tensor_split``
gives chunks whose sizes differ by at most one, so any size works), then:

1. ``reduce_scatter_(chunks)``: ``world_size - 1`` steps; in each, every rank
   sends one chunk to its right neighbour ``r + 1`` and adds the chunk arriving
   from its left neighbour ``r - 1`` into its own copy of that chunk.
   Afterwards ``chunks[r]`` on rank ``r`` holds the sum over all ranks of
   chunk ``r`` (the other chunks may hold partial sums).
2. ``all_gather_(chunks)``: ``world_size - 1`` steps; in each, every rank sends
   one chunk right and overwrites its copy of the chunk arriving from the left.
   Afterwards every chunk is the full sum on every rank.

Both work in place on the list of chunks (views of one flat buffer), and
``ring_all_reduce`` is the two in turn: each rank sends ``2 (world_size - 1)``
chunks in all, about ``2 (world_size - 1) / world_size`` times the tensor's bytes
(the tests count each rank's messages, their peers and their bytes). Post each
send with ``isend`` before the matching receive so no rank waits for another
to receive first, and skip empty chunks (a tensor with fewer elements than
ranks). gloo cannot send from a rank to itself ("Pair is not connected"), so
one rank must send nothing at all.

Hint: which chunk to send in which step is the whole exercise. Work backwards
from the end of the reduce-scatter: in its last step rank ``r`` must receive
chunk ``r`` from its left neighbour, which must therefore have collected every
other rank's share of it. Which chunk did rank ``r`` send in that step, and in
the step before? Write the chunk index as a function of ``r`` and the step
(mod ``p``) and check it on paper for ``p = 3``. Notebook 01 draws the chunks
moving round the ring step by step (section 3).
"""
import torch
import torch.distributed as dist


def reduce_scatter_(chunks: list) -> None:
    # BEGIN SOLUTION
    rank, p = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        send, recv = chunks[(rank - step - 1) % p], chunks[(rank - step - 2) % p]
        incoming = torch.empty_like(recv)
        request = dist.isend(send, right) if send.numel() else None
        if recv.numel():
            dist.recv(incoming, left)
        if request is not None:
            request.wait()
        recv += incoming
    # END SOLUTION


def all_gather_(chunks: list) -> None:
    # BEGIN SOLUTION
    rank, p = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        send, recv = chunks[(rank - step) % p], chunks[(rank - step - 1) % p]
        request = dist.isend(send, right) if send.numel() else None
        if recv.numel():
            dist.recv(recv, left)
        if request is not None:
            request.wait()
    # END SOLUTION


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    # BEGIN SOLUTION
    flat = tensor.detach().reshape(-1).clone()
    chunks = list(torch.tensor_split(flat, dist.get_world_size()))
    reduce_scatter_(chunks)
    all_gather_(chunks)
    return flat.view(tensor.shape)
    # END SOLUTION
