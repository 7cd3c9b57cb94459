# shortcut: correct; int32 count table built transposed, (E/p, p), and sent as its transpose
# graded as: ex08_moe_dispatch.py
# scores: full
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lecture_lib.expert_parallel import all_to_all


@dataclass
class Plan:
    order: torch.Tensor
    send_splits: list
    recv_splits: list


def dispatch(x, expert_index, num_experts, group=None):
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    local = num_experts // p
    order = expert_index.argsort(stable=True)
    by_expert = torch.bincount(expert_index, minlength=num_experts).int()
    table = by_expert.view(p, local).T                           # (E/p, p)
    recv = torch.empty(p, local, dtype=torch.int32)
    dist.all_to_all_single(recv, table.T.contiguous(), group=group)
    send_splits = table.sum(0).tolist()
    recv_splits = recv.sum(1).tolist()
    received = all_to_all(x[order], send_splits, recv_splits, group)
    mine = torch.arange(rank * local, (rank + 1) * local).repeat(p)
    received_expert = mine.repeat_interleave(recv.flatten().long())
    return received, received_expert, Plan(order, send_splits, recv_splits)


def combine(processed, plan, group=None):
    back = all_to_all(processed, plan.recv_splits, plan.send_splits, group)
    return back[plan.order.argsort()]
