"""Tensor parallelism's cost: bytes per block, and a layer's step time on real links.

Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053, section 3) splits each
transformer block so that it needs two all-reduces of the activations
(``batch x seq x d_model`` elements) in the forward pass (one after attention,
one after the MLP: the operator *g*) and two in the backward pass (the operator
*f*). Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", arXiv:2205.05198, section 4.2.2)
replaces each all-reduce by a reduce-scatter plus an all-gather of the same
buffer: since a ring all-reduce *is* a reduce-scatter followed by an all-gather
(Thakur et al. 2005), the volume is the same, while the layer-norm and
residual activations are stored split by sequence.

:func:`tp_block_comm` gives those collectives; the bytes each rank sends
follow from :func:`~lecture_lib.costmodel.comm.bus_factor`.
:func:`tp_layer_time` models one layer's step (compute plus the four
all-reduces, not overlapped) with :func:`~lecture_lib.costmodel.comm.collective_time`.
"""
from __future__ import annotations

from .comm import Link, bus_factor, collective_time

# H100 SXM dense BF16 tensor-core peak: 989 TFLOP/s (NVIDIA H100 Tensor Core GPU datasheet).
H100_BF16_FLOPS = 989e12


def _check_positive(**values) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 1:
            raise ValueError(f"{name} must be a number >= 1, not {v!r}")


def tp_block_comm(batch: int, seq: int, d_model: int, tp: int, bytes_per_element: int = 4,
                  sequence_parallel: bool = False) -> dict:
    """The collectives of one transformer block under tensor parallelism ``tp``.

    Returns ``{phase: {kind: (calls, buffer_bytes_per_call)}}`` for phase in
    ``"forward"``, ``"backward"``; the buffer is the full activation
    ``batch * seq * d_model * bytes_per_element`` (costmodel.comm's convention:
    all-reduce input, reduce-scatter input, all-gather output). With ``tp == 1``
    there is nothing to send.
    """
    _check_positive(batch=batch, seq=seq, d_model=d_model, tp=tp,
                    bytes_per_element=bytes_per_element)
    if tp == 1:
        return {"forward": {}, "backward": {}}
    n = batch * seq * d_model * bytes_per_element
    if sequence_parallel:
        both = {"all_gather": (2, n), "reduce_scatter": (2, n)}
        return {"forward": dict(both), "backward": dict(both)}
    return {"forward": {"all_reduce": (2, n)}, "backward": {"all_reduce": (2, n)}}


def sent_bytes(collectives: dict, tp: int) -> float:
    """Bytes one rank sends for ``{kind: (calls, buffer_bytes)}`` with ring collectives."""
    return sum(calls * nbytes * bus_factor(kind, tp)
               for kind, (calls, nbytes) in collectives.items())


def tp_layer_flops(batch: int, seq: int, d_model: int) -> float:
    """Forward FLOPs of one GPT layer with d_ff = 4 d_model: 24 b s h^2 + 4 b s^2 h
    (Narayanan et al. 2021, arXiv:2104.04473, section 5.1, per layer)."""
    return 24 * batch * seq * d_model ** 2 + 4 * batch * seq ** 2 * d_model


def tp_layer_time(batch: int, seq: int, d_model: int, tp: int, link: Link,
                  flops_per_s: float = H100_BF16_FLOPS, efficiency: float = 0.5,
                  bytes_per_element: int = 2) -> dict:
    """Modelled seconds of one layer's forward + backward on ``tp`` devices joined by ``link``.

    Compute: 3 x the forward FLOPs (backward costs twice the forward), split
    evenly over ``tp`` devices running at ``efficiency`` of ``flops_per_s``.
    Communication: the collectives of :func:`tp_block_comm` on ``link``, not
    overlapped with compute (as in Megatron's tensor parallelism).
    Returns ``{"compute", "comm", "total", "comm_share", "tokens_per_s_per_device"}``.
    """
    _check_positive(tp=tp)
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], not {efficiency}")
    compute = 3 * tp_layer_flops(batch, seq, d_model) / (tp * flops_per_s * efficiency)
    comm = 0.0
    for collectives in tp_block_comm(batch, seq, d_model, tp, bytes_per_element).values():
        for kind, (calls, nbytes) in collectives.items():
            comm += calls * collective_time(kind, nbytes, tp, link)
    total = compute + comm
    return {"compute": compute, "comm": comm, "total": total, "comm_share": comm / total,
            "tokens_per_s_per_device": batch * seq / total / tp}
