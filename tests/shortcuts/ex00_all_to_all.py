# shortcut: every rank sends its whole tensor to every other rank and adds what it receives (all-to-all, not a ring)
# graded as: ex00_ring_sum.py
# scores: at most 5
# message: right neighbour
import torch
import torch.distributed as dist


def ring_sum(tensor: torch.Tensor) -> torch.Tensor:
    rank, size = dist.get_rank(), dist.get_world_size()
    mine = tensor.clone()
    requests = [dist.isend(mine, dst) for dst in range(size) if dst != rank]
    total = tensor.clone()
    incoming = torch.empty_like(tensor)
    for src in range(size):
        if src != rank:
            dist.recv(incoming, src)
            total += incoming
    for r in requests:
        r.wait()
    return total
