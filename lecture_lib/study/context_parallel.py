"""The context-parallel notebook's hand calculations: a Llama-style 70B layer at 128K tokens.

The model is :data:`lecture_lib.costmodel.memory.PRESETS` ``"Llama-style 70B"`` (80 layers,
h = 8192, 64 heads) at s = 131072 tokens, one sequence, bf16, tp = 8 with sequence
parallelism and no stored scores (a flash-style kernel): the notebook's section 1. Q4 ends
on the notebook's section 7, a Llama 3 8B layer in the dry run. Bytes from
:func:`lecture_lib.costmodel.context_parallel.ring_bytes_per_layer` and
``ulysses_bytes_per_layer``; the load imbalance from
:func:`lecture_lib.context_parallel.ring_schedule`.
"""
from __future__ import annotations

from .. import emulate
from ..context_parallel import ring_schedule
from ..context_parallel.emulated import LLAMA3_8B_LAYER
from ..costmodel import NVLINK_H100
from ..costmodel import context_parallel as cpm
from ..costmodel.memory import PRESETS, model_state_bytes
from ..costmodel.tensor_parallel import H100_BF16_FLOPS
from . import fmt

LLAMA = PRESETS["Llama-style 70B"]
SEQ, CP, TP = 131072, 8, 8


def activations_at_cp8() -> list[str]:
    """Q1: the parameter count; activations per device, all 80 layers, at cp = 1 and cp = 8;
    model states at tp = 8."""
    def total(cp):
        return LLAMA.layers * cpm.cp_activation_bytes_per_layer(
            SEQ, 1, LLAMA.hidden, LLAMA.heads, cp=cp, tp=TP, sequence_parallel=True,
            recompute="selective")
    states = model_state_bytes(LLAMA.num_params / TP)        # mixed-precision Adam, no ZeRO
    return [fmt(LLAMA.num_params / 1e9, "billion"), fmt(total(1) / 1e9, "GB"),
            fmt(total(CP) / 1e9, "GB"), fmt(states / 1e9, "GB")]


def bytes_per_layer() -> list[str]:
    """Q2: bytes one rank sends per layer forward, ring against Ulysses, at tp = 8 and cp = 8
    (bf16): a tensor-parallel rank holds a/tp heads, so its K/V (and q, o) are h/tp wide."""
    ring = cpm.ring_bytes_per_layer(1, SEQ, LLAMA.hidden // TP, CP)["forward"]
    ulysses = cpm.ulysses_bytes_per_layer(1, SEQ, LLAMA.hidden // TP, CP)["forward"]
    return [fmt(ring / 1e6, "MB"), fmt(ulysses / 1e6, "MB")]


def kv_heads_per_rank(heads: int, kv_heads: int, tp: int) -> tuple[int, int]:
    """``(K/V heads one tensor-parallel rank holds, ranks that hold each K/V head)`` when
    ``heads`` query heads share ``kv_heads`` K/V heads (grouped-query attention) over ``tp`` ranks.

    Tensor parallelism splits attention by heads, and a rank needs whole K/V heads beside the
    query heads that use them. The query heads must split evenly, as the library checks
    everywhere (``heads % tp == 0``, e.g. :func:`lecture_lib.costmodel.memory_per_device`).
    For the K/V heads the condition flips at ``tp = kv_heads``: up to it, ``tp`` must divide
    ``kv_heads`` and each rank holds ``kv_heads / tp`` of them (Megatron-LM's only case: it
    divides its query groups by tp); past it, ``kv_heads`` must divide ``tp`` and each rank
    holds one K/V head, replicated on ``tp / kv_heads`` ranks (vLLM's ``QKVParallelLinear``).
    Anything else raises ValueError.
    """
    if min(heads, kv_heads, tp) < 1 or heads % kv_heads:
        raise ValueError(f"need heads, kv_heads, tp >= 1 and kv_heads dividing heads: "
                         f"heads={heads}, kv_heads={kv_heads}, tp={tp}")
    if heads % tp:
        raise ValueError(f"{heads} query heads do not split over tp={tp}")
    if tp <= kv_heads:
        if kv_heads % tp:
            raise ValueError(f"tp={tp} does not divide the {kv_heads} K/V heads: each rank "
                             f"must hold whole K/V heads")
        return kv_heads // tp, 1
    if tp % kv_heads:
        raise ValueError(f"tp={tp} exceeds the {kv_heads} K/V heads but is not a multiple of "
                         f"them: each K/V head must sit on tp / kv_heads ranks")
    return 1, tp // kv_heads


def causal_imbalance() -> list[str]:
    """Q3: slowest over fastest rank's attended chunk pairs at cp = 8, both layouts."""
    out = []
    for layout in ("contiguous", "zigzag"):
        work = [sum(len(step[r]["pairs"]) for step in ring_schedule(CP, layout, True))
                for r in range(CP)]
        out.append(f"{max(work) / min(work):g}x")
    return out


def hop_hiding_length() -> list[str]:
    """Q4: local tokens s/cp from which a bf16 K/V hop on H100 NVLink hides behind a fused
    causal zig-zag block at peak (half a full block's 4 b (s/cp)^2 h FLOPs, as
    :func:`~lecture_lib.costmodel.context_parallel.cp_exposed_comm` charges it):
    2 b (s/cp)^2 h / F >= 2 b (s/cp) h e / beta, i.e. s/cp >= e F / beta.

    Then the notebook's section 7 (Llama 3 8B, GQA: K/V h_kv = h/4 wide): the threshold with
    GQA, and with the share of the peak the emulator charges a flash kernel on the 512-token
    chunks of its 8K-token run (forward, unmasked, head size 128; 2 cp = 16 chunks)."""
    local = 2 * H100_BF16_FLOPS / NVLINK_H100.beta
    layer = LLAMA3_8B_LAYER
    gqa = local * layer.n_kv_heads * layer.head_dim / layer.d_model
    chunk = 8192 // (2 * CP)
    share = emulate.preset("h100-node").device.attention.share(False, layer.head_dim, chunk, False)
    return [f"{local:.0f} tokens", f"{local * CP:.0f} tokens", f"{gqa:.0f} tokens",
            f"{chunk}-token chunks", f"{share:.1%}", f"{gqa * share:.0f} tokens"]


ANSWERS = {"Q1": activations_at_cp8, "Q2": bytes_per_layer, "Q3": causal_imbalance,
           "Q4": hop_hiding_length}
