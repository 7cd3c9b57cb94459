# shortcut: both phases right, but ring_all_reduce passes the whole tensor round the ring (ex00's ring sum: p-1 full-size messages, not 2(p-1) chunks)
# graded as: ex01_ring_allreduce.py
# scores: at most 5
# message: bytes
import torch
import torch.distributed as dist


def _ring(chunks, send_of, recv_of, add):
    rank, p = dist.get_rank(), dist.get_world_size()
    for step in range(p - 1):
        send, recv = chunks[send_of(rank, step, p)], chunks[recv_of(rank, step, p)]
        incoming = torch.empty_like(recv)
        request = dist.isend(send, (rank + 1) % p) if send.numel() else None
        if recv.numel():
            dist.recv(incoming, (rank - 1) % p)
        if request is not None:
            request.wait()
        if add:
            recv += incoming
        else:
            recv.copy_(incoming)


def reduce_scatter_(chunks):
    _ring(chunks, lambda r, s, p: (r - s - 1) % p, lambda r, s, p: (r - s - 2) % p, True)


def all_gather_(chunks):
    _ring(chunks, lambda r, s, p: (r - s) % p, lambda r, s, p: (r - s - 1) % p, False)


def ring_all_reduce(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    total = tensor.detach().clone()
    outgoing, incoming = tensor.detach().clone(), torch.empty_like(tensor)
    for _ in range(p - 1):
        request = dist.isend(outgoing, (rank + 1) % p)
        dist.recv(incoming, (rank - 1) % p)
        request.wait()
        total += incoming
        outgoing, incoming = incoming, outgoing
    return total
