# shortcut: every token sent to every rank by all-to-all (no count exchange), rows picked there
# graded as: ex08_moe_dispatch.py
# scores: at most 7
# message: each token travels once
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
    local, n = num_experts // p, x.shape[0]
    everyone = all_to_all(x.repeat(p, 1), [n] * p, [n] * p, group)
    experts = torch.empty(n * p, dtype=expert_index.dtype)
    dist.all_to_all_single(experts, expert_index.repeat(p), group=group)
    keep = ((experts >= rank * local) & (experts < (rank + 1) * local)).nonzero().squeeze(1)
    return everyone[keep], experts[keep], Plan(keep, [n] * p, [n] * p)


def combine(processed, plan, group=None):
    p, n = len(plan.send_splits), plan.send_splits[0]
    full = processed.new_zeros((n * p,) + tuple(processed.shape[1:]))
    full = full.index_add(0, plan.order, processed)
    back = all_to_all(full, [n] * p, [n] * p, group)
    return back.view(p, n, -1).sum(0)
