# shortcut: an off-by-one in the reduce-scatter; the all-gather is right
# graded as: ex01_ring_allreduce.py
# scores: at most 9
# message: reduce_scatter_ alone
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
    _ring(chunks, lambda r, s, p: (r - s) % p, lambda r, s, p: (r - s - 1) % p, True)

def all_gather_(chunks):
    _ring(chunks, lambda r, s, p: (r - s) % p, lambda r, s, p: (r - s - 1) % p, False)

def ring_all_reduce(tensor):
    flat = tensor.detach().reshape(-1).clone()
    chunks = list(torch.tensor_split(flat, dist.get_world_size()))
    reduce_scatter_(chunks)
    all_gather_(chunks)
    return flat.view(tensor.shape)
