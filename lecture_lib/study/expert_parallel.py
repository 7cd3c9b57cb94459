"""The expert-parallel notebook: the numbers of the self-study answers.

Q1: all-to-all bytes per token (costmodel.all_to_all_bytes; even routing);
Q2: an MoE layer's parameters and FLOPs against one dense MLP (costmodel.moe_params,
moe_flops_per_token; Kaplan et al. 2020, Switch Transformer);
Q3: expert capacity and the tokens an overloaded expert drops (Switch, section 2.2);
Q5: what if the router nearly collapses onto one expert (router probability pi, ``p0`` in
the code; the notebook's p counts ranks): the load-balancing loss (Switch, eq. 4, computed by
the layer's own ``load_balancing_loss``), the tokens dropped, and the loss's gradient on the
router's logits, which vanishes as the probability reaches 1.
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


def q2_params_and_flops(h: int = 768, d_ff: int = 3072, experts: int = 64, k: int = 2) -> list[str]:
    """The MoE layer's parameters and forward FLOPs per token, as multiples of one MLP's
    (hidden size ``h``, inner width ``d_ff``)."""
    dense_flops = 2 * (2 * h * d_ff)
    return [fmt(moe_params(h, d_ff, experts) / mlp_params(h, d_ff), "x"),
            fmt(moe_flops_per_token(h, d_ff, experts, k) / dense_flops, "x")]


def q3_capacity(tokens: int = 4096, experts: int = 8, factor: float = 1.25,
                routed: int = 1000) -> list[str]:
    """Slots per expert, ceil(factor k T / E) with k = 1, and how many of ``routed`` drop."""
    capacity = expert_capacity(tokens, experts, 1, factor)
    return [f"{capacity} slots", f"{routed - capacity} tokens"]


def _aux(probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Switch's E sum_e f_e P_e for one batch on one rank, top-1 (``chosen``: each token's
    expert), differentiable through ``probs``."""
    tokens, experts = probs.shape
    counts = [[torch.bincount(chosen, minlength=experts).tolist()]]     # one rank, one choice
    return load_balancing_loss(probs, counts, probs.detach().sum(0), tokens)


def _collapsed(p0: float, tokens: int, experts: int) -> tuple[float, float]:
    """Every token on expert 0 with router probability ``p0`` (the rest spread evenly): the
    aux loss, and ``tokens x`` the gradient of the loss on one token's logit of expert 0
    (autograd through the softmax: ``E p0 (1 - p0)``)."""
    row = torch.full((experts,), (1 - p0) / (experts - 1), dtype=torch.float64)
    row[0] = p0
    logits = torch.log(row).repeat(tokens, 1).requires_grad_()
    aux = _aux(torch.softmax(logits, -1), torch.zeros(tokens, dtype=torch.long))
    aux.backward()
    return float(aux.detach()), float(logits.grad[0, 0]) * tokens


def q5_collapsed_router(tokens: int = 4096, experts: int = 8, factor: float = 1.25,
                        p0: float = 0.99) -> list[str]:
    """Near-collapse: every token picks expert 0 with probability ``p0``, top-1. The aux loss
    against an even router's 1; expert 0's slots and the tokens dropped; the gradient the
    loss puts on a token's logit of expert 0 (times T) at ``p0`` and at ``1 - (1 - p0)/10``:
    it shrinks towards 0 as ``p0 -> 1`` (at exactly 1 the softmax's slope is 0)."""
    aux, grad = _collapsed(p0, tokens, experts)
    closer = 1 - (1 - p0) / 10
    _, grad_closer = _collapsed(closer, tokens, experts)
    even = float(_aux(torch.full((tokens, experts), 1 / experts), torch.arange(tokens) % experts))
    capacity = expert_capacity(tokens, experts, 1, factor)
    dropped = tokens - capacity
    return [f"{aux:.3g}", f"an even router gives {even:g}", f"{capacity} slots",
            f"{dropped} of {tokens} tokens", fmt(100 * dropped / tokens, "%"),
            f"{grad:.3g} at $\\pi = {p0:g}$", f"{grad_closer:.3g} at $\\pi = {closer:g}$"]


ANSWERS = {"Q1": q1_bytes_per_token, "Q2": q2_params_and_flops, "Q3": q3_capacity,
           "Q5": q5_collapsed_router}
