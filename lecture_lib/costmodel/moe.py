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

A whole MoE transformer (:class:`MoESpec`, for the planner's expert-parallel axis,
:func:`lecture_lib.costmodel.planner.plan_expert_parallel`) is a dense transformer
(a :class:`~.memory.TransformerShape` whose every MLP is one expert: Mixtral 8x7B is
Mistral 7B with 8 experts, Jiang et al. 2024, arXiv 2401.04088) with every ``every``-th
MLP replaced by an MoE layer. Its parameters split into *dense* ones (attention,
embeddings, norms, routers, the MLPs left dense), which every data-parallel rank holds,
and *expert* ones, which expert parallelism divides over the ``ep`` ranks of a group
(:func:`moe_param_split`). With a capacity factor ``c``, every expert's buffer has
``c k T / E`` slots and runs on all of them, so a token costs ``c k`` experts'
FLOPs (GShard and Switch pad to capacity; a dropless router, Megatron-Core's
default and Mixtral's, has ``c = 1`` with even routing).
"""
from __future__ import annotations

from dataclasses import dataclass

from .comm import bus_factor
from .memory import TransformerShape, memory_per_device, model_state_breakdown


def _check(d_model: int, d_ff: int, num_experts: int, k: int) -> None:
    for name, v in (("d_model", d_model), ("d_ff", d_ff), ("num_experts", num_experts), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
    if k > num_experts:
        raise ValueError(f"k={k} is larger than the number of experts ({num_experts})")


def mlp_params(d_model: int, d_ff: int, gated: bool = False) -> int:
    """Parameters of one dense MLP d -> f -> d with biases (one expert); ``gated``: a
    SwiGLU MLP (Shazeer 2020), three matrices (two d -> f, one f -> d), as in Llama and Mixtral."""
    if gated:
        return 3 * d_model * d_ff + 2 * d_ff + d_model
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
    if not 0.0 <= kept_fraction <= 1.0:
        raise ValueError("kept_fraction must be in [0, 1]")
    n = dispatch_buffer_bytes(kept_fraction * tokens, d_model, k, bytes_per_element)
    return bus_factor("all_to_all", world_size) * n


def dispatch_buffer_bytes(tokens: float, d_model: int, k: int, bytes_per_element: int = 4) -> float:
    """Bytes of one rank's dispatch send buffer: ``tokens * k`` rows of ``d_model`` values.

    ``tokens`` may be scaled: by the kept fraction (dropped slots are not sent), or by a
    capacity factor (buffers padded to capacity, as in GShard and Switch).
    """
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, not {tokens}")
    return tokens * k * d_model * bytes_per_element


@dataclass(frozen=True)
class MoESpec:
    """How a dense transformer becomes an MoE one: every ``every``-th layer's MLP (of width
    ``d_ff``; ``gated``: SwiGLU) is replaced by ``num_experts`` experts with top-``k`` routing
    and a ``capacity_factor`` (the slots each expert computes, padding included)."""
    num_experts: int
    k: int
    d_ff: int
    every: int = 1
    capacity_factor: float = 1.0
    gated: bool = False

    def __post_init__(self):
        _check(1, self.d_ff, self.num_experts, self.k)
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"every must be a whole number >= 1, not {self.every!r}")
        if not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0, not {self.capacity_factor!r}")

    def moe_layers(self, layers: int) -> int:
        """How many of ``layers`` layers have an MoE MLP (layers every, 2 every, ...)."""
        return layers // self.every


def moe_param_split(shape: TransformerShape, moe: MoESpec) -> dict:
    """Parameters of the MoE model built on ``shape`` (whose MLPs are one expert each).

    ``dense``: all but the experts, routers included; ``expert``: all experts of all MoE
    layers; ``total``; ``active``: what one token's forward pass uses, ``dense`` plus ``k``
    experts per MoE layer, times the capacity factor (the padded slots are computed too).
    """
    one = mlp_params(shape.hidden, moe.d_ff, moe.gated)
    n = moe.moe_layers(shape.layers)
    dense = shape.num_params - n * one + n * shape.hidden * moe.num_experts
    if dense <= 0:
        raise ValueError(f"{shape.name}'s {shape.num_params:g} parameters cannot hold {n} MLPs "
                         f"of {one} parameters: is d_ff={moe.d_ff} (gated={moe.gated}) its MLP?")
    expert = n * moe.num_experts * one
    return {"dense": dense, "expert": expert, "total": dense + expert,
            "active": dense + moe.capacity_factor * moe.k * n * one}


def mlp_activation_bytes(tokens: float, d_model: int, d_ff: int, gated: bool = False) -> float:
    """Bytes one MLP keeps for backward (16-bit values, 1-byte dropout mask).

    Plain: input ``2 d``, the first matmul's output and the GeLU's ``2 x 2 f``, the dropout
    mask ``d``: ``19 d`` per token at ``f = 4 d``, Korthikanti et al.'s MLP share (Table 2's
    derivation). SwiGLU: input ``2 d`` and three ``2 f`` tensors, no dropout.
    """
    return tokens * (2 * d_model + 6 * d_ff if gated else 3 * d_model + 4 * d_ff)


def moe_extra_activation_bytes(shape: TransformerShape, moe: MoESpec, microbatch_size: int,
                               tp: int = 1, recompute: str = "none") -> float:
    """Bytes an MoE model keeps beyond :func:`~.memory.memory_per_device`'s dense layers.

    That model counts a dense MLP of width ``4 h`` in every layer (Korthikanti et al.);
    an MoE layer runs ``c k`` expert MLPs of width ``d_ff`` per token instead (split over
    ``tp`` like the dense one). Full recomputation keeps only each layer's input: no extra.
    Summed over the MoE layers, as the dense model sums ``L`` layers (1F1B's first stage).
    """
    if recompute == "full":
        return 0.0
    tokens = microbatch_size * shape.seq_len
    moe_mlp = moe.capacity_factor * moe.k * mlp_activation_bytes(tokens, shape.hidden, moe.d_ff,
                                                                 moe.gated)
    dense_mlp = mlp_activation_bytes(tokens, shape.hidden, 4 * shape.hidden)
    return moe.moe_layers(shape.layers) * (moe_mlp - dense_mlp) / tp


def memory_per_device_ep(shape: TransformerShape, moe: MoESpec, ep: int = 1, dp: int = 1,
                         tp: int = 1, pp: int = 1, zero_stage: int = 0, microbatch_size: int = 1,
                         recompute: str = "none") -> dict:
    """Bytes on one device of an MoE model under ``dp x tp x pp`` with ``ep`` carved out of dp.

    Dense parameters as :func:`~.memory.memory_per_device` counts them (``1/(tp pp)`` of
    them, ZeRO over ``dp``); the experts: ``E/ep`` of them per device, each split over
    ``tp`` and ``pp`` like the dense layers, replicated over the ``dp/ep`` ranks that hold
    the same experts and ZeRO-sharded over those (DeepSpeed's MoE training, Kim et al. 2021,
    arXiv 2109.10465; Megatron-Core's expert data-parallel group). ``"experts"``: the expert
    states alone (already inside params, grads and optimizer).
    """
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ValueError(f"ep must be a whole number >= 1, not {ep!r}")
    if moe.num_experts % ep:
        raise ValueError(f"ep={ep} does not divide the {moe.num_experts} experts")
    if dp % ep:
        raise ValueError(f"ep={ep} must divide dp={dp}: expert-parallel groups are carved "
                         "out of the data-parallel ranks")
    split = moe_param_split(shape, moe)
    dense_shape = TransformerShape(shape.name, shape.layers, shape.hidden, shape.heads,
                                   shape.vocab, shape.seq_len, split["dense"])
    out = memory_per_device(dense_shape, dp, tp, pp, zero_stage, microbatch_size,
                            recompute=recompute)
    experts = model_state_breakdown(split["expert"] / (ep * tp * pp), dp // ep, zero_stage)
    for kind in ("params", "grads", "optimizer"):
        out[kind] += experts[kind]
    out["activations"] += moe_extra_activation_bytes(shape, moe, microbatch_size, tp, recompute)
    out["total"] = out["params"] + out["grads"] + out["optimizer"] + out["activations"]
    out["experts"] = experts["total"]
    return out
