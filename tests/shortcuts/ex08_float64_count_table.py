# shortcut: a correct answer whose count table travels as float64 (the statement allows it)
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
    send_counts = torch.bincount(expert_index, minlength=num_experts).view(p, local).double()
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send_counts, recv_counts = send_counts.long(), recv_counts.long()
    send_splits, recv_splits = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
    received = all_to_all(x[order], send_splits, recv_splits, group)
    mine = torch.arange(rank * local, (rank + 1) * local).repeat(p)
    received_expert = mine.repeat_interleave(recv_counts.flatten())
    return received, received_expert, Plan(order, send_splits, recv_splits)


def combine(processed, plan, group=None):
    back = all_to_all(processed, plan.recv_splits, plan.send_splits, group)
    return back[plan.order.argsort()]
