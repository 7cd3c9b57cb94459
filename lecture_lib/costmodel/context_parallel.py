"""Context parallelism's cost: activation memory per device, bytes per layer, exposed time.

With the sequence split over ``cp`` ranks every rank stores the activations
of ``s / cp`` tokens for every layer, so each of Korthikanti et al.'s terms
(2022, Table 2; :func:`.memory.activation_bytes_per_layer`) is divided by
``cp``; the attention-score term too, because each local query still meets
all ``s`` keys (``5 a (s / cp) s b`` bytes), and under ring attention with a
flash-style kernel that term is not stored at all (Liu et al. 2023).

Ring attention's communication, per layer and micro-batch, derived from the
ring (:mod:`lecture_lib.context_parallel.ring`): a rank's K and V slices are
``2 b (s / cp) h`` values; the forward pass passes ``cp - 1`` of them on, so one
rank sends

    forward    2 (cp - 1) / cp * b s h values      (K and V: (cp - 1)/cp of each)
    backward   2 (2 cp - 1) / cp * b s h values    (K, V again, and dK, dV home: cp hops)

and every hop can overlap with the attention of the block already held
(the Playbook's context-parallelism chapter; Llama 3, Dubey et al. 2024,
section 3.3.2, all-gathers K/V instead: the same (cp - 1)/cp volume).
DeepSpeed-Ulysses (Jacobs et al. 2023, section 3.2) instead runs four
all-to-alls of ``b s h / cp`` values per layer forward (q, k, v, out) and four
backward, a rank sending ``(cp - 1)/cp`` of each: ``4 (cp - 1) / cp^2 b s h``,
which shrinks with cp; ring's does not. With grouped-query attention K and V
are narrower (``kv_width``: the K/V heads times the head size): ring's bytes
shrink ``d_model / kv_width`` times, Ulysses' only on its k and v.

:func:`gpt_block_activation_bytes` is the exact count, by the same method as
Korthikanti's section 4.1, of what the course's fp32 GPT block saves (no
dropout); notebooks check it against ``metrics.saved_tensor_bytes``.
"""
from __future__ import annotations

from .comm import Link
from .memory import TransformerShape, activation_bytes_per_layer, memory_per_device

ATTENTION_KERNELS = ("ring", "sdpa")


def _check(**values) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")


def cp_activation_bytes_per_layer(seq_len: int, microbatch_size: int, hidden: int, heads: int,
                                  cp: int = 1, tp: int = 1, sequence_parallel: bool = False,
                                  recompute: str = "none") -> float:
    """Korthikanti's bytes per layer (16-bit) for the whole sequence, divided by ``cp``."""
    _check(cp=cp)
    return activation_bytes_per_layer(seq_len, microbatch_size, hidden, heads, tp,
                                      sequence_parallel, recompute) / cp


def gpt_block_activation_bytes(seq_len: int, batch: int, d_model: int, heads: int, cp: int = 1,
                               attention: str = "ring", bytes_per_element: int = 4) -> int:
    """Bytes one block of ``lecture_lib.models.GPT`` saves per device, counted tensor by tensor.

    Per local token (``s / cp`` of them, ``h = d_model``): block input and
    ln1 output (2h), q, k, v and the attention output (4h), the projection's
    input (h; with torch's CPU SDPA it is the output's own storage, so 0),
    the residual and ln2 output (2h), fc1 output and GELU output (8h); the
    two layer norms' mean and 1/std (4); the attention log-sum-exp (one per
    head, ``heads``). No dropout, so none of Korthikanti's masks.
    """
    _check(seq_len=seq_len, batch=batch, d_model=d_model, heads=heads, cp=cp)
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be one of {ATTENTION_KERNELS}, not {attention!r}")
    if seq_len % cp:
        raise ValueError(f"sequence length {seq_len} does not split over cp={cp}")
    per_token = (17 if attention == "ring" else 16) * d_model + 4 + heads
    return batch * (seq_len // cp) * per_token * bytes_per_element


def ring_bytes_per_layer(batch: int, seq_len: int, d_model: int, cp: int,
                         bytes_per_element: int = 2, kv_width: int | None = None) -> dict:
    """Bytes one rank sends per layer with ring attention: ``{"forward", "backward"}``.
    ``kv_width``: K and V's width with grouped-query attention (K/V heads x head size;
    default ``d_model``): ring passes only K and V."""
    _check(batch=batch, seq_len=seq_len, d_model=d_model, cp=cp)
    bsh = batch * seq_len * (d_model if kv_width is None else kv_width) * bytes_per_element
    return {"forward": 2 * (cp - 1) / cp * bsh, "backward": 2 * (2 * cp - 1) / cp * bsh
            if cp > 1 else 0.0}


def ulysses_bytes_per_layer(batch: int, seq_len: int, d_model: int, cp: int,
                            bytes_per_element: int = 2, kv_width: int | None = None) -> dict:
    """Bytes one rank sends per layer with Ulysses' all-to-alls: ``{"forward", "backward"}``.
    ``kv_width``: as for :func:`ring_bytes_per_layer`; q and the output stay ``d_model`` wide."""
    _check(batch=batch, seq_len=seq_len, d_model=d_model, cp=cp)
    width = 4 * d_model if kv_width is None else 2 * d_model + 2 * kv_width   # q, k, v, out
    per_pass = (cp - 1) / cp ** 2 * batch * seq_len * width * bytes_per_element
    return {"forward": per_pass, "backward": per_pass}


def ring_attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, pairs: int,
                         chunks: int) -> float:
    """Forward FLOPs of ``pairs`` chunk pairs of ``seq_len / chunks`` tokens each (QK^T, PV)."""
    t = seq_len // chunks
    return pairs * 4 * batch * heads * t * t * head_dim


def cp_exposed_comm(shape: TransformerShape, microbatch_size: int, cp: int, link: Link | None,
                    flops_per_s: float, bytes_per_element: int = 2) -> float:
    """Seconds per layer and micro-batch that ring attention's sends are *not* hidden.

    Each of the ``cp - 1`` forward hops (and ``2cp - 1`` backward ones) moves one
    K/V (or dK/dV) slice while the rank attends to the block it holds: a
    balanced (zig-zag) causal block costs ``2 b (s/cp)^2 h`` FLOPs forward,
    twice that backward. Exposed = hops x max(0, hop time - block compute).
    """
    if cp == 1 or link is None:
        return 0.0
    s_local = shape.seq_len / cp
    msg = 2 * microbatch_size * s_local * shape.hidden * bytes_per_element
    hop = link.alpha + msg / link.beta
    block = 2 * microbatch_size * s_local ** 2 * shape.hidden / flops_per_s
    return (cp - 1) * max(0.0, hop - block) + (2 * cp - 1) * max(0.0, hop - 2 * block)


def memory_per_device_cp(shape: TransformerShape, cp: int = 1, dp: int = 1, tp: int = 1,
                         pp: int = 1, zero_stage: int = 0, microbatch_size: int = 1,
                         recompute: str = "none", sequence_parallel: bool = False,
                         precision: str = "mixed (bf16/fp16 + fp32 master)") -> dict:
    """:func:`.memory.memory_per_device` with the sequence split over ``cp`` ranks.

    Activations divide by ``cp``; model states are sharded (ZeRO) over the
    ``dp x cp`` ranks, which all hold the same weights, as Megatron-Core's
    distributed optimizer does over its data-and-context-parallel group.
    """
    _check(cp=cp)
    mem = memory_per_device(shape, dp * cp, tp, pp, zero_stage, microbatch_size,
                            recompute=recompute, sequence_parallel=sequence_parallel,
                            precision=precision)
    mem["activations"] /= cp
    mem["total"] = mem["params"] + mem["grads"] + mem["optimizer"] + mem["activations"]
    return mem
