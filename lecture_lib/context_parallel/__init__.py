"""Context parallelism: long sequences split across ranks for every layer.

* :mod:`.attention`: blockwise attention and the exact online-softmax merge;
* :mod:`.layout`: contiguous and zig-zag (load-balanced) slices of the sequence;
* :mod:`.ring`: ring attention (Liu et al. 2023), forward and backward;
* :mod:`.ulysses`: DeepSpeed-Ulysses' all-to-all to heads and back (Jacobs et al. 2023);
* :mod:`.model`: a GPT whose attention runs context-parallel;
* :mod:`.experiments`: training, load balance, bytes per layer, activation memory, overlap;
* :mod:`.emulated`: ring and Ulysses timed at real size (a Llama 3 8B layer, dry run).

The ring's K/V blocks, step by step, are drawn in
:mod:`lecture_lib.figures.pictures.ring_steps`.
"""
from .attention import (
    KERNELS,
    attention_reference,
    block_attention,
    block_attention_backward,
    causal_mask,
    flash_block_attention,
    flash_block_attention_backward,
    merge,
)
from .layout import (
    LAYOUTS,
    check_layout,
    check_layout_name,
    check_slice_tokens,
    num_chunks,
    positions,
    rank_chunks,
    shard_sequence,
    unshard_sequence,
)
from .model import (
    METHODS,
    ContextParallelAttention,
    LayoutPositionEmbedding,
    check_context_parallel,
    make_attention,
    parallelize_gpt,
    sync_context_parallel_grads,
)
from .ring import (
    RingAttention,
    RingFunction,
    block_pairs,
    check_ring_slices,
    gather_slice_shapes,
    ring_attention,
    ring_schedule,
    ring_shift,
)
from .ulysses import UlyssesAttention, check_ulysses, heads_to_seq, seq_to_heads, ulysses_attention

__all__ = [
    "KERNELS", "attention_reference", "block_attention", "block_attention_backward",
    "causal_mask", "flash_block_attention", "flash_block_attention_backward", "merge",
    "LAYOUTS", "check_layout", "check_layout_name", "check_slice_tokens", "num_chunks",
    "positions", "rank_chunks", "shard_sequence", "unshard_sequence",
    "METHODS", "ContextParallelAttention", "LayoutPositionEmbedding", "check_context_parallel",
    "make_attention", "parallelize_gpt", "sync_context_parallel_grads",
    "RingAttention", "RingFunction", "block_pairs", "check_ring_slices", "gather_slice_shapes",
    "ring_attention", "ring_schedule", "ring_shift",
    "UlyssesAttention", "check_ulysses", "heads_to_seq", "seq_to_heads", "ulysses_attention",
]
