# shortcut: the block computed first, the exchange after: right numbers, nothing overlapped
# graded as: ex13_ring_attention.py
# scores: at most 7
# message: not posted before the block's compute
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
    part = block_attention(q, kv[0], kv[1])
    state = part if state is None else merge(*state, *part)
    received = torch.empty_like(kv)
    works = [dist.isend(kv.contiguous(), (rank + 1) % size),
             dist.irecv(received, (rank - 1) % size)]
    for w in works:
        w.wait()
    return state, received

def ring_attention(q, k, v):
    kv, state = torch.stack([k, v]), None
    for _ in range(dist.get_world_size()):
        state, kv = ring_step(q, kv, state)
    return state[0]
