"""The emulation against published GPU measurements: the calibration table the course shows.

For each published figure (:mod:`lecture_lib.emulate.published`) this module
asks the emulation what it charges for the same work, on the preset of that
hardware, and sets the two side by side with the relative error
``emulated / published - 1``. A row says whether the anchor was used to set
the emulation's constants (``fitted``: a curve's two ends fix its two
constants, the largest GEMM fixes the matmul efficiency and the smallest a
matmul's fill, each flash-attention curve's longest sequence its share of the
peak and its shortest its fill) or is a check the constants never saw. The
end-to-end row (llm.c's GPT-2 step) is a check of everything at once: nothing
is fitted to it.

How each figure is emulated:

* all-reduce bus bandwidth: ``bus bytes / seconds`` the preset charges one
  all-reduce of that size on 8 ranks of one node (the H200 node's figures on
  the ``h100-node`` preset: the same NVLink 4 switch, whose NVLS constants
  come from the H200 curve); the ring figure with NVLS turned off; the
  InfiniBand figure on 16 ranks in two nodes.
* GEMM: one matmul of the anchor's shape on meta tensors (shapes, no values),
  fp16 on the A100 (``m = n = k``), bf16 on the H100 (``b x (m x k) @ (k x n)``,
  a batched one as ``bmm``), charged as one kernel; rate = ``2 b m n k / seconds``.
* attention: one flash-attention kernel (the SDPA operation the CPU runs, the
  emulation's stand-in for the GPU's) on meta tensors of the benchmark's shape,
  ``16384 / tokens`` sequences of ``2048 / head dim`` heads, forward, backward
  or both; rate = torch's FLOPs of the kernels / their seconds.
* HBM: one 1 GiB bf16 copy; bandwidth = bytes read and written / seconds.
* llm.c: one step of the course's GPT at GPT-2 124M's size (vocab padded to
  50304 as llm.c does), 64 x 1024 tokens per GPU, on 8 emulated H100s with
  data parallelism, in the dry-run mode (fake tensors), with the optimizer
  fused as llm.c's AdamW kernel is.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from ..data_parallel import DDPBucketed
from ..emulate import current, nccl, run
from ..emulate import published as P
from ..emulate.compute import op_cost
from ..emulate.presets import preset
from ..models import GPT, GPTConfig, lm_loss

GPT2_STEP_RANKS = 8


def table(anchors=None, gpt2_step=None) -> list[dict]:
    """One row per anchor: published, emulated, error, fitted or a check, the source."""
    rows = []
    for a in P.ANCHORS if anchors is None else anchors:
        emulated = emulated_figure(a, gpt2_step)
        rows.append({"anchor": a.key, "what": a.what, "unit": a.unit, "published": a.value,
                     "emulated": emulated, "error": emulated / a.value - 1,
                     "fitted": a.key in P.FITTED, "source": a.source})
    return rows


def summary(rows: list[dict]) -> dict:
    """The worst and the median absolute error over the checks (the anchors not fitted)."""
    checks = [abs(r["error"]) for r in rows if not r["fitted"]]
    return {"checks": len(checks), "worst": max(checks), "median": statistics.median(checks)}


def emulated_figure(anchor: P.Anchor, gpt2_step=None) -> float:
    """What the emulation charges for the work behind one published anchor (in its unit)."""
    h100, a100 = preset("h100-node"), preset("a100-node")
    if anchor in P.H200_ALLREDUCE:
        return _bus_bandwidth(h100, anchor.size, 8)
    if anchor in P.A100_ALLREDUCE:
        return _bus_bandwidth(a100, anchor.size, 8)
    if anchor is P.H100_RING_1GB:
        ring = replace(h100, intra_fabric=replace(h100.intra_fabric, nvls_busbw=0.0))
        return _bus_bandwidth(ring, anchor.size, 8)
    if anchor is P.NDR_NIC:
        return _bus_bandwidth(h100, anchor.size, 16)
    if anchor in (P.A100_GEMM_PEAK, P.A100_GEMM_1024):
        m = int(anchor.size)
        return _gemm_rate(a100, 1, m, m, m, torch.float16)
    if anchor in P.H100_GEMMS:
        return _gemm_rate(h100, *anchor.shape)
    if anchor in P.A100_FA2:
        return _attention_rate(a100, *anchor.shape)
    if anchor in P.H100_FA2_FORWARD + P.H100_FA2_BACKWARD + P.H100_FA2:
        return _attention_rate(h100, *anchor.shape)
    if anchor is P.A100_HBM:
        return _copy_bandwidth(a100)
    if anchor is P.H200_HBM:
        return _copy_bandwidth(preset("h100-node", device=replace(
            h100.device, memory_bandwidth=4.8e12)))
    if anchor is P.LLMC_STEP:
        return gpt2_step() if gpt2_step is not None else llmc_step_seconds()
    raise ValueError(f"no emulation for the anchor {anchor.key!r}")


def llmc_step_seconds(ranks: int = GPT2_STEP_RANKS, batch: int = 64,
                      timeout: float = 300.0) -> float:
    """Emulated seconds of one GPT-2 124M step as llm.c's record ran it (see the docstring)."""
    cfg = GPTConfig(vocab_size=50304, seq_len=1024, d_model=768, n_heads=12, n_layers=12)
    cluster = preset("h100-node", optimizer="fused")
    results = run(_gpt2_rank, ranks, cfg, batch, preset=cluster, dry_run=True, timeout=timeout)
    return max(r.result for r in results)
def _gpt2_rank(cfg, batch: int) -> float:
    """Rank function: one data-parallel step of the GPT on fake tensors; emulated seconds."""
    clock = current()
    model = GPT(cfg, seed=0)
    ddp = DDPBucketed(model, bucket_size_mb=25.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len))
    start = clock.synchronize()
    ddp.on_train_batch_start()
    loss = lm_loss(ddp(x), x)
    loss.backward()
    ddp.finish_gradient_synchronization()
    opt.step()
    return clock.synchronize() - start


def _bus_bandwidth(cluster, nbytes: float, ranks: int) -> float:
    seconds = cluster.collective_seconds("all_reduce", nbytes, range(ranks))
    return nccl.bus_bytes("all_reduce", nbytes, ranks) / seconds


def _gemm_rate(cluster, b: int, m: int, n: int, k: int, dtype=torch.bfloat16) -> float:
    a = torch.empty(b, m, k, dtype=dtype, device="meta")
    w = torch.empty(b, k, n, dtype=dtype, device="meta")
    func, args = torch.ops.aten.bmm.default, (a, w)
    if b == 1:
        func, args = torch.ops.aten.mm.default, (a[0], w[0])
    seconds, flops, _ = op_cost(func, args, {}, args[0] @ args[1], cluster)
    return flops / seconds


_SDPA_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_SDPA_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _attention_rate(cluster, pass_: str, head_dim: int, tokens: int, causal: bool) -> float:
    """FLOP/s of the flash-attention kernels of one anchor (see the module's docstring)."""
    shape = (16384 // tokens, 2048 // head_dim, tokens, head_dim)
    q, k, v, out, grad = (torch.empty(shape, dtype=torch.bfloat16, device="meta")
                          for _ in range(5))
    lse = torch.empty(shape[:-1], dtype=torch.float32, device="meta")
    kernels = {"forward": (_SDPA_FORWARD, (q, k, v, 0.0, causal), (out, lse)),
               "backward": (_SDPA_BACKWARD, (grad, q, k, v, out, lse, 0.0, causal), (q, k, v))}
    passes = ("forward", "backward") if pass_ == "fwd+bwd" else (pass_,)
    seconds = flops = 0.0
    for name in passes:
        func, args, result = kernels[name]
        s, f, _ = op_cost(func, args, {}, result, cluster)
        seconds, flops = seconds + s, flops + f
    return flops / seconds


def _copy_bandwidth(cluster, nbytes: int = 2 ** 30) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="meta")
    dst = torch.empty_like(src)
    seconds, _, moved = op_cost(torch.ops.aten.copy_.default, (dst, src), {}, dst, cluster)
    return moved / seconds
