"""The expert-parallel notebook: the numbers of the self-study answers.

Q1: all-to-all bytes per token (costmodel.all_to_all_bytes; even routing);
Q2: an MoE layer's parameters and FLOPs against one dense MLP (costmodel.moe_params,
moe_flops_per_token; Kaplan et al. 2020, Switch Transformer);
Q3: expert capacity and the tokens an overloaded expert drops (Switch, section 2.2);
Q5: what if the router collapses onto one expert: the load-balancing loss (Switch, eq. 4,
computed by the layer's own ``load_balancing_loss``) and the tokens dropped.
"""
from __future__ import annotations

import torch

from ..costmodel import all_to_all_bytes, mlp_params, moe_flops_per_token, moe_params
from ..expert_parallel import expert_capacity
from ..expert_parallel.router import load_balancing_loss
from . import fmt


def q1_bytes_per_token(hidden: int = 7168, k: int = 8, ranks: int = 64,
                       bytes_per_element: int = 2) -> list[str]:
    """Bytes one token sends off its rank in one dispatch, and in the 4 all-to-alls of a
    layer's forward and backward (dispatch + combine, each way)."""
    one = all_to_all_bytes(1, hidden, k, ranks, bytes_per_element)
    return [fmt(one / 2**10, "KiB"), fmt(4 * one / 2**10, "KiB")]


def q2_params_and_flops(d: int = 768, f: int = 3072, experts: int = 64, k: int = 2) -> list[str]:
    """The MoE layer's parameters and forward FLOPs per token, as multiples of one MLP's."""
    dense_flops = 2 * (2 * d * f)
    return [fmt(moe_params(d, f, experts) / mlp_params(d, f), "x"),
            fmt(moe_flops_per_token(d, f, experts, k) / dense_flops, "x")]


def q3_capacity(tokens: int = 4096, experts: int = 8, factor: float = 1.25,
                routed: int = 1000) -> list[str]:
    """Slots per expert, ceil(factor k T / E) with k = 1, and how many of ``routed`` drop."""
    capacity = expert_capacity(tokens, experts, 1, factor)
    return [f"{capacity} slots", f"{routed - capacity} tokens"]


def _aux(probs: torch.Tensor, chosen: torch.Tensor) -> float:
    """Switch's E sum_e f_e P_e for one batch on one rank, top-1 (``chosen``: each token's
    expert)."""
    tokens, experts = probs.shape
    counts = torch.bincount(chosen, minlength=experts).view(1, 1, experts)
    return float(load_balancing_loss(probs, counts, probs.sum(0), tokens))


def q5_collapsed_router(tokens: int = 4096, experts: int = 8, factor: float = 1.25) -> list[str]:
    """Every token picks expert 0 with probability 1: the aux loss (its maximum, E), against
    an even router's 1; expert 0's slots and the tokens dropped, top-1."""
    collapsed = _aux(torch.eye(experts)[torch.zeros(tokens, dtype=torch.long)],
                     torch.zeros(tokens, dtype=torch.long))
    even = _aux(torch.full((tokens, experts), 1 / experts), torch.arange(tokens) % experts)
    capacity = expert_capacity(tokens, experts, 1, factor)
    dropped = tokens - capacity
    return [f"{collapsed:g} (its maximum, E)", f"an even router gives {even:g}",
            f"{capacity} slots", f"{dropped} of {tokens} tokens", fmt(100 * dropped / tokens, "%")]


ANSWERS = {"Q1": q1_bytes_per_token, "Q2": q2_params_and_flops, "Q3": q3_capacity,
           "Q5": q5_collapsed_router}
