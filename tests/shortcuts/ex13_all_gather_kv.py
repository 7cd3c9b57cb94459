# shortcut: ring_attention all-gathers every rank's K and V and runs one softmax over them all
# graded as: ex13_ring_attention.py
# scores: at most 7
# message: never holds every rank's K and V
import math

import torch
import torch.distributed as dist


def block_attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def merge(o_a, lse_a, o_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return (torch.exp(lse_a - lse).unsqueeze(-1) * o_a
            + torch.exp(lse_b - lse).unsqueeze(-1) * o_b), lse


def ring_step(q, kv, state):
    rank, size = dist.get_rank(), dist.get_world_size()
    received, works = kv, []
    if size > 1:
        received = torch.empty_like(kv)
        works = [dist.isend(kv.contiguous(), (rank + 1) % size),
                 dist.irecv(received, (rank - 1) % size)]
    part = block_attention(q, kv[0], kv[1])
    state = part if state is None else merge(*state, *part)
    for w in works:
        w.wait()
    return state, received


def ring_attention(q, k, v):
    size = dist.get_world_size()
    ks = [torch.empty_like(k) for _ in range(size)]
    vs = [torch.empty_like(v) for _ in range(size)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    return torch.nn.functional.scaled_dot_product_attention(q, torch.cat(ks, -2),
                                                            torch.cat(vs, -2))
