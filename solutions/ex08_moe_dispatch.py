"""Exercise 08: send tokens to their experts' ranks with all-to-all, and bring them back.

Expert parallelism spreads ``num_experts`` experts over the ``p`` ranks of a
group: rank ``r`` holds experts ``r * E/p ... (r + 1) * E/p - 1``. The router
has already chosen one expert per token (``expert_index``, shape ``(n,)``;
top-1, nothing dropped). Write the two all-to-alls around the experts:

``dispatch(x, expert_index, num_experts)`` returns ``(received, received_expert,
plan)``: every row this rank's experts must process (from every rank,
itself included), the global expert index of each received row, and a
:class:`Plan` for the way back.

``combine(processed, plan)`` takes the experts' outputs, row for row as
``received`` came in, and returns the ``(n, d)`` outputs in the original token
order of this rank: row ``i`` is token ``i``'s expert output.

Rules and hints:

* Counts vary from rank to rank and batch to batch, so the token all-to-all
  needs per-rank split sizes, and a rank cannot know how many rows it will
  receive until the others tell it: exchange the counts first, with
  ``dist.all_to_all_single`` on a small tensor of counts: an int64 ``(p, E/p)``
  table (``torch.bincount``'s dtype), row ``s`` saying how many tokens go to
  each expert of rank ``s``; the table you receive has, in row ``s``, what
  rank ``s`` sends to each of your experts. (Another dtype, or an all-gather
  of every rank's ``(E,)`` counts, works as well and scores the same: the
  tests measure the tokens, and let a count table of at most ``p x E``
  numbers travel besides.)
* Move the tokens with ``lecture_lib.expert_parallel.all_to_all(x, send_splits,
  recv_splits, group)``: ``all_to_all_single`` on dim 0 with split sizes,
  written as an autograd Function so the gradient travels back through it
  (the tests backpropagate through your code). Each token travels once, to its
  expert's rank and back: the tests count the bytes of tokens each rank
  receives in dispatch (the rows of its experts) and in combine (its own rows),
  and that they come by all-to-all (an all-gather would send every token to
  every rank: p times the bytes).
* Order the rows you send by expert (a stable sort keeps the tokens of one
  expert in their original order): then the rows for each destination rank are
  contiguous, in expert order, and the block received from each rank is ordered
  by expert too. Keep the order: combine has to undo it.
* Do not modify ``x``.
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lecture_lib.expert_parallel import all_to_all


@dataclass
class Plan:
    """What combine needs: how tokens were sorted and how many rows went where."""
    order: torch.Tensor          # token indices, sorted by expert (the send order)
    send_splits: list            # rows sent to each rank
    recv_splits: list            # rows received from each rank


def dispatch(x: torch.Tensor, expert_index: torch.Tensor, num_experts: int, group=None):
    # BEGIN SOLUTION
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    local = num_experts // p
    order = expert_index.argsort(stable=True)
    send_counts = torch.bincount(expert_index, minlength=num_experts).view(p, local)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)     # row s: from rank s
    send_splits, recv_splits = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
    received = all_to_all(x[order], send_splits, recv_splits, group)
    mine = torch.arange(rank * local, (rank + 1) * local, device=x.device).repeat(p)
    received_expert = mine.repeat_interleave(recv_counts.flatten())
    return received, received_expert, Plan(order, send_splits, recv_splits)
    # END SOLUTION


def combine(processed: torch.Tensor, plan: Plan, group=None) -> torch.Tensor:
    # BEGIN SOLUTION
    back = all_to_all(processed, plan.recv_splits, plan.send_splits, group)
    return back[plan.order.argsort()]
    # END SOLUTION
