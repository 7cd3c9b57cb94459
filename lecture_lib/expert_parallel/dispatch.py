"""Expert parallelism's communication: the all-to-all, and who sends how many rows where.

Expert parallelism puts ``E / p`` experts on each of ``p`` ranks (GShard,
Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021). Every rank
routes its own tokens; one all-to-all sends each token to the rank holding
its expert (*dispatch*), the experts run, and a second all-to-all brings the
results home (*combine*). Two ranks, experts 0-1 on rank 0 and 2-3 on rank 1::

    rank 0 tokens: a->0 b->3 c->1        dispatch         rank 0 runs experts 0, 1 on: a c | d
    rank 1 tokens: d->1 e->2 f->3     ============>       rank 1 runs experts 2, 3 on: b   | e f
                                       combine: the same rows back, the same way reversed

How many rows go from rank r to rank s changes with every batch, so the
all-to-all takes per-rank split sizes (``all_to_all_single(out, in,
output_split_sizes, input_split_sizes)``), which both ends must know before
the tokens move: first the ranks all-gather their ``(k, E)`` count tables
(:func:`exchange_counts`; all of them, not only the columns of a rank's own
experts, because capacity is filled in one global order); from that table each
reads its send and receive split sizes (:func:`plan_dispatch`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import comm
from .router import Admission, Routing


def all_to_all(x: torch.Tensor, send_splits: list[int], recv_splits: list[int],
               group=None, phase: str = "forward") -> torch.Tensor:
    """Differentiable ``all_to_all_single`` on dim 0 with per-rank split sizes.

    ``x`` holds ``send_splits[r]`` rows for rank r, in rank order; the result
    holds ``recv_splits[r]`` rows from rank r. Gradients travel back the same
    way. With one rank (or ``group=LOCAL``) it returns ``x``. ``phase`` labels the
    call for a watcher (:func:`lecture_lib.comm.record_comm`).
    """
    group, _, size = comm.resolve(group)
    if len(send_splits) != size or len(recv_splits) != size:
        raise ValueError(f"need one split size per rank ({size}), got {len(send_splits)} "
                         f"to send and {len(recv_splits)} to receive")
    if sum(send_splits) != x.shape[0]:
        raise ValueError(f"send splits {send_splits} add up to {sum(send_splits)}, "
                         f"but x has {x.shape[0]} rows")
    if size == 1:
        return x
    return AllToAll.apply(x, list(send_splits), list(recv_splits), group, phase)


class AllToAll(torch.autograd.Function):
    """Forward: rows ``send_splits[r]`` go to rank r. Backward: the same exchange reversed
    (each row's gradient goes back to the rank it came from)."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group, phase):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        return _exchange(x, send_splits, recv_splits, group, phase)

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        return _exchange(grad, recv_splits, send_splits, ctx.group, "backward"), None, None, \
            None, None


def _exchange(x, send_splits, recv_splits, group, phase):
    out = x.new_empty((sum(recv_splits),) + tuple(x.shape[1:]))
    with comm.collective("all_to_all", x.numel() * x.element_size(), len(send_splits), phase,
                         x.device):
        dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
    return out


def exchange_counts(routing: Routing, group=None) -> tuple[list, torch.Tensor]:
    """One all-gather: every rank's ``(k, E)`` count table, and the global probability sum.

    Returns the table ``counts_all[r][j][e]`` as integers on the host (the split
    sizes are read from it) and the sum over all tokens of the router
    probabilities, ``(E,)`` float64. A routing fixed before the step already
    knows the table: the exchange is the same, and nothing is read back.
    """
    group, _, size = comm.resolve(group)
    k, num_experts = routing.counts.shape
    message = torch.cat([routing.counts.double().flatten(),
                         routing.probs.detach().double().sum(0)])
    if size == 1:
        table = message.unsqueeze(0)
    else:
        table = message.new_empty(size * message.numel())
        comm.all_gather_into(table, message, group, phase="counts")
        table = table.view(size, -1)
    prob_sum = table[:, k * num_experts:].sum(0)
    if routing.counts_all is not None:
        return routing.counts_all, prob_sum
    # the one read from device to host of the layer: every split size comes from it
    counts = table[:, :k * num_experts].round().long().view(size, k, num_experts)
    return counts.tolist(), prob_sum


@dataclass
class DispatchPlan:
    """The send buffer's layout and both ends' split sizes, for this rank."""
    order: torch.Tensor         # kept slots (slot-major index j*n + t), sorted by expert
    token_of: torch.Tensor      # the token of each row sent
    send_splits: list[int]      # rows to each rank
    recv_splits: list[int]      # rows from each rank
    recv_per: list[list[int]]   # (p, E/p): rows from each rank for each local expert


def plan_dispatch(routing: Routing, admitted: Admission, expert_ids: list[int]) -> DispatchPlan:
    """Kept slots sorted by expert (so by destination rank), and what arrives from whom."""
    n, k = routing.expert.shape
    num_experts, p = routing.probs.shape[-1], len(admitted.kept_all)
    local = num_experts // p

    def kept(r, e):
        return sum(admitted.kept_all[r][j][e] for j in range(k))

    send_per_expert = [kept(admitted.rank, e) for e in range(num_experts)]
    recv_per = [[kept(r, e) for e in expert_ids] for r in range(p)]
    # slot-major slots, the dropped ones keyed past every expert: a stable sort puts the
    # kept slots first, by expert, in their original order (the count is known, not read)
    slot_expert = routing.expert.T.reshape(-1)
    key = slot_expert + num_experts * (~admitted.keep.T.reshape(-1)).long()
    order = key.argsort(stable=True)[:sum(send_per_expert)]
    send_splits = [sum(send_per_expert[s * local:(s + 1) * local]) for s in range(p)]
    return DispatchPlan(order, order % n, send_splits, [sum(row) for row in recv_per], recv_per)
