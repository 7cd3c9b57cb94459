# shortcut: every token all-gathered to every rank (p times the bytes), then picked locally
# graded as: ex08_moe_dispatch.py
# scores: at most 7
# message: moved the tokens with ['all_gather']
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn


@dataclass
class Plan:
    order: torch.Tensor
    send_splits: list
    recv_splits: list

def dispatch(x, expert_index, num_experts, group=None):
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    local = num_experts // p
    xs = torch.cat(dnn.all_gather(x, group=group))
    es = [torch.empty_like(expert_index) for _ in range(p)]
    dist.all_gather(es, expert_index, group=group)
    es = torch.cat(es)
    order = es.argsort(stable=True)
    mine = order[(es[order] >= rank * local) & (es[order] < (rank + 1) * local)]
    return xs[mine], es[mine], Plan(mine, [len(x)] * p, [len(mine)])

def combine(processed, plan, group=None):
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    n = plan.send_splits[0]
    full = processed.new_zeros((n * p,) + tuple(processed.shape[1:]))
    full = full.index_add(0, plan.order, processed)
    full = torch.stack(dnn.all_gather(full, group=group)).sum(0)
    return full[rank * n:(rank + 1) * n]
