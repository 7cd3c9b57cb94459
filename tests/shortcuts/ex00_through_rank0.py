# shortcut: every rank sends its tensor to rank 0, which adds them up and sends the sum back (a star through rank 0, not a ring)
# graded as: ex00_ring_sum.py
# scores: at most 5
# message: right neighbour
import torch
import torch.distributed as dist


def ring_sum(tensor: torch.Tensor) -> torch.Tensor:
    rank, size = dist.get_rank(), dist.get_world_size()
    total = tensor.clone()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for src in range(1, size):
            dist.recv(incoming, src)
            total += incoming
        for dst in range(1, size):
            dist.send(total, dst)
    else:
        dist.send(tensor.clone(), 0)
        dist.recv(total, 0)
    return total
