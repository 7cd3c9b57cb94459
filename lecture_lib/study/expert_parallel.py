"""The expert-parallel notebook: the numbers of the self-study answers.

Q1: all-to-all bytes per token (costmodel.all_to_all_bytes; even routing);
Q2: an MoE layer's parameters and FLOPs against one dense MLP (costmodel.moe_params,
moe_flops_per_token; Kaplan et al. 2020, Switch Transformer);
Q3: expert capacity and the tokens an overloaded expert drops (Switch, section 2.2).
"""
from __future__ import annotations

from ..costmodel import all_to_all_bytes, mlp_params, moe_flops_per_token, moe_params
from ..expert_parallel import expert_capacity
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


ANSWERS = {"Q1": q1_bytes_per_token, "Q2": q2_params_and_flops, "Q3": q3_capacity}
