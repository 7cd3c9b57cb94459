"""Expert parallelism's communication: who sends which tokens where, and the all-to-all.

Expert parallelism puts ``E / p`` experts on each of ``p`` ranks (GShard,
Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021). Every rank
routes its own tokens, then one all-to-all sends each token to the rank that
holds its expert ("dispatch"), the experts run, and a second all-to-all
brings the results home ("combine"). The number of tokens a rank sends to
each other rank varies from batch to batch, so the all-to-alls use per-rank
split sizes (``all_to_all_single(out, in, output_split_sizes,
input_split_sizes)``), and those sizes must be known on both ends *before*
the tokens move.

Why the counts are all-gathered, not all-to-all'ed: to know which of its
tokens fit, a rank needs how many tokens the ranks *before* it sent to each
expert (its place in the global order). One all-gather of the ``(k, E)``
count table (:func:`exchange_counts`) gives every rank the whole table, from
which it reads both its send and its receive split sizes
(:func:`plan_dispatch`) and the global load-balancing statistics.

Every exchange runs through :func:`lecture_lib.comm.collective`: recorded
inside :func:`lecture_lib.comm.record_comm`, free otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import comm
from .router import Admission, Routing


def _exchange(x, send_splits, recv_splits, group, phase):
    out = x.new_empty((sum(recv_splits),) + tuple(x.shape[1:]))
    size = len(send_splits)
    with comm.collective("all_to_all", x.numel() * x.element_size(), size, phase, x.device):
        dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
    return out


class AllToAll(torch.autograd.Function):
    """Forward: rows ``send_splits[r]`` go to rank r. Backward: the same exchange reversed."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group, phase):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        return _exchange(x, send_splits, recv_splits, group, phase)

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        back = _exchange(grad, recv_splits, send_splits, ctx.group, "backward")
        return back, None, None, None, None


def all_to_all(x: torch.Tensor, send_splits: list[int], recv_splits: list[int],
               group=None, phase: str = "forward") -> torch.Tensor:
    """Differentiable ``all_to_all_single`` on dim 0 with per-rank split sizes.

    ``x`` holds ``send_splits[r]`` rows for rank r, in rank order; the result
    holds ``recv_splits[r]`` rows from rank r. Gradients travel back the same
    way. With one rank (or ``group=LOCAL``) it returns ``x``.
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


def exchange_counts(routing: Routing, group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One all-gather: every rank's ``(k, E)`` count table and the global probability sum.

    Returns ``counts_all`` (p, k, E) and the sum over all tokens of the router
    probabilities (E,), in float64.
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
    counts_all = table[:, :k * num_experts].round().long().view(size, k, num_experts)
    return counts_all, table[:, k * num_experts:].sum(0)


@dataclass
class DispatchPlan:
    """The send buffer's layout and both ends' split sizes, for this rank."""
    order: torch.Tensor         # kept slots (slot-major index j*n + t), sorted by expert
    token_of: torch.Tensor      # the token of each row sent
    send_splits: list[int]      # rows to each rank
    recv_splits: list[int]      # rows from each rank
    recv_per: torch.Tensor      # (p, E/p) rows from each rank for each local expert


def plan_dispatch(routing: Routing, admitted: Admission, expert_ids: list[int]) -> DispatchPlan:
    """Kept slots sorted by expert (so by destination rank), and what arrives from whom."""
    n, num_experts = routing.expert.shape[0], routing.probs.shape[-1]
    p = admitted.kept_all.shape[0]
    slot_expert = routing.expert.T.reshape(-1)                          # slot-major
    kept_slots = admitted.keep.T.reshape(-1).nonzero().squeeze(1)
    order = kept_slots[slot_expert[kept_slots].argsort(stable=True)]
    per_expert = torch.bincount(slot_expert[order], minlength=num_experts)
    recv_per = admitted.kept_all[:, :, expert_ids].sum(1)               # (p, E/p)
    return DispatchPlan(order, order % n, per_expert.view(p, -1).sum(1).tolist(),
                        recv_per.sum(1).tolist(), recv_per)
