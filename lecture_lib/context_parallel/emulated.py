"""Context parallelism on emulated GPUs, at real size in the dry run.

:func:`layers_pass` (a rank function) runs transformer blocks of a
:class:`~lecture_lib.models.GPTConfig` with their attention context-parallel
(ring attention, contiguous or zig-zag, or Ulysses), forward and backward,
under the emulation (:mod:`lecture_lib.emulate`). The same function times a
small model on real tensors (the tests: its dry clock equals its real one)
and a real-size one on fake tensors, charged as on the GPU and computed
nowhere (:func:`time_at_scale`). The default is one Llama 3 8B layer (Dubey
et al. 2024, Table 3: h = 4096, 32 query heads sharing 8 K/V heads of 128,
SwiGLU d_ff = 14336) on one sequence of 128K tokens over cp = 8 H100s, in bf16;
the ring attends each block with the fused flash kernel, as real rings do
(:data:`.attention.KERNELS`), and Ulysses with torch's SDPA, the same kernel.

What the lesson reads: ``exposed``, the seconds a rank's compute stream
waits (for a K/V hop, an all-to-all, or a slower rank); ``compute``, its busy
seconds (the zig-zag layout evens them out under the causal mask); the link's
``comm`` seconds and the bytes each rank sent.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.nn as nn

from .. import emulate
from ..comm import resolve
from ..models import Block, GPTConfig, real_size
from ..runtime import launch
from .attention import check_kernel
from .experiments import exchanges_waited
from .model import ContextParallelAttention, check_context_parallel, make_attention

#: One Llama 3 8B layer (GQA: 8 K/V heads; SwiGLU) at 128K tokens
LLAMA3_8B_LAYER = real_size("Llama 3 8B", n_layers=1, seq_len=131072)


def time_at_scale(cp: int = 8, method: str = "ring", layout: str = "zigzag",
                  cfg: GPTConfig = LLAMA3_8B_LAYER, batch: int = 1, kernel: str = "flash",
                  preset="h100-node", dtype: torch.dtype = torch.bfloat16,
                  backward: bool = True, overlap: bool = True, timeout: float = 180) -> dict:
    """``cfg.n_layers`` context-parallel blocks (forward and backward) on ``cp`` emulated GPUs,
    in the dry run: ``batch`` sequences of ``cfg.seq_len`` tokens, ``seq_len / cp`` per rank.
    ``overlap=False``: the ring waits for each exchange as soon as it posts it
    (:func:`.experiments.exchanges_waited`), the step without overlap.

    Returns plain data: ``step`` (emulated seconds, the slowest rank's), ``ranks[r]`` (its
    ``step``, ``compute``, ``exposed`` and ``exposed_forward`` seconds, the link's ``comm``
    seconds, ``messages``, ``sent_bytes`` and ``compute_by_op``), ``timeline[r]`` (kind,
    start, end, what) from the step's start, ``wall_seconds``, and what varied.
    """
    check_context_parallel(cfg, cp, layout, method)
    check_kernel(kernel)
    cluster = emulate.preset(preset)
    began = time.perf_counter()
    results = launch.run(layers_pass, cp, cfg, method, layout, kernel, batch, dtype, backward,
                         cluster, True, overlap, timeout=timeout)
    wall = time.perf_counter() - began
    ranks = [rank_split(r) for r in results]
    return {"step": max(r["step"] for r in ranks), "ranks": ranks,
            "timeline": [r.pop("timeline") for r in ranks], "wall_seconds": wall,
            "cp": cp, "method": method, "layout": layout, "kernel": kernel,
            "seq_len": cfg.seq_len, "tokens_per_rank": cfg.seq_len // cp, "batch": batch,
            "layers": cfg.n_layers, "d_model": cfg.d_model, "heads": cfg.n_heads,
            "kv_heads": cfg.n_kv_heads, "backward": backward, "overlap": overlap,
            "preset": cluster.label(),
            "dtype": str(dtype).removeprefix("torch.")}


def layers_pass(cfg: GPTConfig, method: str, layout: str, kernel: str, batch: int,
                dtype: torch.dtype, backward: bool, preset, dry_run: bool,
                overlap: bool = True) -> dict:
    """Inside a rank: ``cfg.n_layers`` blocks on this rank's ``seq_len / cp`` tokens, forward
    (and backward), emulated on ``preset`` (``dry_run``: on fake tensors; ``overlap=False``:
    each ring exchange waited for at once). Returns the clock and when the pass started, its
    forward ended, and it ended (emulated seconds), and the pass's kernel seconds by
    operation (``by_op``)."""
    _, _, cp = resolve(None)
    tokens = cfg.seq_len // cp
    attend = make_attention(method, None, layout, True, kernel)
    q_shape = (batch, cfg.n_heads, tokens, cfg.head_dim)
    kv_shape = (batch, cfg.n_kv_heads, tokens, cfg.head_dim)
    attend.check(q_shape, kv_shape, kv_shape, launch.device())   # its message: before the clock
    waits = nullcontext() if overlap else exchanges_waited()
    with waits, emulate.emulated(preset, dry_run=dry_run) as clock:
        blocks = context_parallel_blocks(cfg, attend, dtype)      # the model inside the block
        x = torch.randn(batch, tokens, cfg.d_model, dtype=dtype, device=launch.device(),
                        requires_grad=True)
        dy = torch.randn_like(x)
        start = clock.synchronize()
        before = dict(clock.seconds_by_op)
        with clock.phase("forward"):
            y = blocks(x)
        forward_end = clock.now()
        if backward:
            with clock.phase("backward"):
                y.backward(dy)
        end = clock.synchronize()
    by_op = {op: t - before.get(op, 0.0) for op, t in clock.seconds_by_op.items()}
    return {"clock": clock, "start": start, "forward_end": forward_end, "end": end,
            "by_op": {op: t for op, t in by_op.items() if t > 0}}


def context_parallel_blocks(cfg: GPTConfig, attend, dtype: torch.dtype) -> nn.Sequential:
    """``cfg.n_layers`` of the course's blocks in ``dtype``, each attending through ``attend``."""
    blocks = nn.Sequential(*(Block(cfg) for _ in range(cfg.n_layers)))
    blocks.to(device=launch.device(), dtype=dtype)
    for block in blocks:
        block.attn = ContextParallelAttention(block.attn, attend)
    return blocks


def rank_split(passed: dict) -> dict:
    """One rank's pass from :func:`layers_pass`: the compute stream busy (``compute``) or
    waiting (``exposed``; ``exposed_forward`` in the forward pass), its kernels' seconds by
    operation (``compute_by_op``), the link's transfer seconds (``comm``), its messages and
    the bytes it sent to other ranks."""
    clock, start, end = passed["clock"], passed["start"], passed["end"]
    mine = [(kind, s - start, e - start, what) for kind, s, e, what in clock.spans
            if s >= start and e <= end]
    forward = passed["forward_end"] - start
    # the emulation files a send under its buffer, an all-to-all under what leaves the rank
    sent = clock.bytes_by_kind.get("send", 0) + clock.bytes_by_kind.get("all_to_all", 0)
    return {"step": end - start,
            "compute": sum(e - s for k, s, e, _ in mine if k not in ("comm", "idle")),
            "exposed": sum(e - s for k, s, e, _ in mine if k == "idle"),
            "exposed_forward": sum(e - s for k, s, e, _ in mine if k == "idle" and e <= forward),
            "compute_by_op": passed["by_op"],
            "comm": sum(e - s for k, s, e, _ in mine if k == "comm"),
            "messages": sum(1 for k, *_ in mine if k == "comm"),
            "sent_bytes": sent, "timeline": mine}
