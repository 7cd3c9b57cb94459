"""Mixture of experts: parameters, FLOPs per token and all-to-all bytes.

An MoE layer holds ``E`` copies of the dense MLP ("experts") and a router,
but each token runs through only ``k`` of them (Shazeer et al. 2017,
"Outrageously Large Neural Networks"; Fedus, Zoph & Shazeer 2021, "Switch
Transformers", k = 1). Parameters grow with ``E``; FLOPs per token grow with
``k`` only. A forward pass costs 2 FLOPs per multiply-add, i.e. about
``2 x (parameters a token touches)`` (Kaplan et al. 2020, "Scaling Laws for
Neural Language Models", section 2.1):

    parameters        E (2 d f + f + d) + d E          (experts + router)
    FLOPs per token   k * 2 (2 d f)     + 2 d E        (k expert MLPs + router)

Expert parallelism sends every kept token to the rank holding its expert and
back, each one an all-to-all. With routing spread evenly over ``p`` ranks,
``(p - 1) / p`` of a rank's ``n`` bytes leave it, which is the all-to-all's
bus factor (:func:`lecture_lib.costmodel.comm.bus_factor`).
"""
from __future__ import annotations

from .comm import bus_factor


def _check(d_model: int, d_ff: int, num_experts: int, k: int) -> None:
    for name, v in (("d_model", d_model), ("d_ff", d_ff), ("num_experts", num_experts), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
    if k > num_experts:
        raise ValueError(f"k={k} is larger than the number of experts ({num_experts})")


def mlp_params(d_model: int, d_ff: int) -> int:
    """Parameters of one dense MLP d -> f -> d with biases (one expert)."""
    return 2 * d_model * d_ff + d_ff + d_model


def moe_params(d_model: int, d_ff: int, num_experts: int) -> int:
    """Parameters of an MoE layer: ``num_experts`` MLPs and a bias-free router d -> E."""
    _check(d_model, d_ff, num_experts, 1)
    return num_experts * mlp_params(d_model, d_ff) + d_model * num_experts


def moe_flops_per_token(d_model: int, d_ff: int, num_experts: int, k: int) -> int:
    """Forward FLOPs per token: ``k`` expert MLPs (2 matmuls each) plus the router.

    Matmul FLOPs only (2 per multiply-add); a dense MLP is ``num_experts=1, k=1``
    less the router's ``2 d``.
    """
    _check(d_model, d_ff, num_experts, k)
    return k * 2 * (2 * d_model * d_ff) + 2 * d_model * num_experts


def all_to_all_bytes(tokens: int, d_model: int, k: int, world_size: int,
                     bytes_per_element: int = 4, kept_fraction: float = 1.0) -> float:
    """Bytes one rank sends to *other* ranks in one dispatch all-to-all, routing even.

    The send buffer holds ``kept_fraction * tokens * k`` rows of ``d_model``
    elements; an even spread keeps ``1/p`` of it at home. The combine
    all-to-all sends the same amount back.
    """
    if tokens < 0 or not 0.0 <= kept_fraction <= 1.0:
        raise ValueError("tokens must be >= 0 and kept_fraction in [0, 1]")
    n = kept_fraction * tokens * k * d_model * bytes_per_element
    return bus_factor("all_to_all", world_size) * n
