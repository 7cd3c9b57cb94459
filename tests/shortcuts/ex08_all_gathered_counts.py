# shortcut: correct; all-gathers every rank's (E,) counts as float64, as exchange_counts does
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
    counts = torch.bincount(expert_index, minlength=num_experts).double()
    table = counts.new_empty(p * num_experts)
    dist.all_gather_into_tensor(table, counts, group=group)
    table = table.view(p, num_experts).round().long()            # row s: rank s's counts
    send_splits = table[rank].view(p, local).sum(1).tolist()
    recv_counts = table[:, rank * local:(rank + 1) * local]      # (p, E/p): from each rank
    recv_splits = recv_counts.sum(1).tolist()
    received = all_to_all(x[order], send_splits, recv_splits, group)
    mine = torch.arange(rank * local, (rank + 1) * local).repeat(p)
    received_expert = mine.repeat_interleave(recv_counts.flatten())
    return received, received_expert, Plan(order, send_splits, recv_splits)


def combine(processed, plan, group=None):
    back = all_to_all(processed, plan.recv_splits, plan.send_splits, group)
    return back[plan.order.argsort()]
