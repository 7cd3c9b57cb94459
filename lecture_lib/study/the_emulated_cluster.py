"""Appendix A2 (the emulated cluster): waves and split-K, NCCL's choice, kernels and launches.

* Q2: a matmul's work units on an H100 (``emulate.kernels.matmul_tiles``: 128 x 128 output
  tiles, split along the inner dimension when there are fewer tiles than SMs) and the share
  of SMs its waves keep busy (``busy_share``), for two weight gradients of GPT-2 small on
  8 sequences of 1,024 tokens: the MLP's first layer (768 x 3072) and an attention
  projection (768 x 768).
* Q3 (what if): NCCL's choice for one bucket of torch's default size on 8 and on 2 GPUs of
  the emulated H100 node (``bucket_cap_mb=25``: torch multiplies it by 2**20, so 25 MiB;
  ``lecture_lib.emulate.nccl``: the Simple ring pays a latency per step, ``2 (p-1)`` steps;
  NVLS one fixed latency; both move the same bus bytes).
* Q4 (what if): a step of tiny kernels on the emulated H100, eager and with CUDA graphs:
  the host spends ``launch_seconds`` per kernel, the GPU ``kernel_seconds`` per kernel and a
  matmul's ``matmul_fill_seconds`` more; the slower side sets the step.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..emulate import FABRICS, H100_SXM, nccl
from ..emulate.kernels import busy_share, matmul_tiles
from . import fmt

TOKENS, WIDTH = 8 * 1024, 768                 # GPT-2 small, 8 sequences per rank
NCCL_BUCKET, NCCL_SIZES = 25 * 2**20, (8, 2)  # torch's default bucket_cap_mb=25: MiB
KERNELS, MATMULS = 400, 100                   # Q4's step


def weight_gradient(d_in: int, d_out: int, tokens: int = TOKENS, device=H100_SXM) -> dict:
    """Tiles, split-K pieces, work units, waves and busy share of ``x^T @ dy``: a
    ``d_in x d_out`` output summed over ``tokens``."""
    out = torch.empty(d_in, d_out, device="meta")
    tiles = math.ceil(d_in / 128) * math.ceil(d_out / 128)
    units = matmul_tiles(out, tokens, device.sms)
    return {"tiles": tiles, "pieces": units // tiles, "units": units,
            "waves": math.ceil(units / device.sms), "busy": busy_share(units, device.sms)}


def q2() -> list[str]:
    fc1, proj = weight_gradient(WIDTH, 4 * WIDTH), weight_gradient(WIDTH, WIDTH)
    assert fc1["pieces"] == 1 < proj["pieces"]
    return [f"{fc1['tiles']} tiles", f"{fc1['waves']} waves", f"{fc1['busy']:.0%}",
            f"only {fc1['units'] - (fc1['waves'] - 1) * H100_SXM.sms} tiles",
            f"{proj['tiles']} tiles", f"{proj['pieces']} pieces", f"{proj['units']} units",
            f"{proj['busy']:.0%}"]


def ring_and_nvls(nbytes: float, p: int, fabric=FABRICS["nvlink4"]) -> dict:
    """Emulated seconds of one all-reduce of ``nbytes`` on ``p`` GPUs of one node: NCCL's
    choice, the best ring (LL or Simple: the same fabric without NVLS) and NVLS."""
    ring = nccl.nccl_choice("all_reduce", nbytes, p, replace(fabric, nvls_busbw=0.0,
                                                              nvls_latency=0.0))
    nvls = fabric.nvls_latency + nccl.bus_bytes("all_reduce", nbytes, p) / fabric.nvls_busbw
    return {"choice": nccl.nccl_choice("all_reduce", nbytes, p, fabric), "ring": ring,
            "nvls": nvls}


def q3() -> list[str]:
    fabric = FABRICS["nvlink4"]
    ring_latency = {p: nccl.SIMPLE_BASE + nccl.steps("all_reduce", p) * fabric.step_latency
                    for p in NCCL_SIZES}
    # NVLS's one latency: longer than the Simple ring's whole latency on 2 GPUs, shorter on 8
    assert ring_latency[2] < fabric.nvls_latency < ring_latency[8]
    out = [fmt(NCCL_BUCKET / 1e6, "MB")]                     # 25 MiB in bytes / 1e6
    for p in NCCL_SIZES:
        r = ring_and_nvls(NCCL_BUCKET, p)
        assert r["ring"][0] == "ring/Simple"
        out += [f"{r['choice'][0]} at p = {p}", fmt(r["nvls"] * 1e6, "us"),
                fmt(r["ring"][1] * 1e6, "us")]
    return out


def tiny_step(kernels: int = KERNELS, matmuls: int = MATMULS, device=H100_SXM) -> dict:
    """Seconds of a step of ``kernels`` kernels that do almost nothing: the host's launches,
    the GPU's fixed costs, and the step eager (the slower of the two) and with CUDA graphs."""
    host = kernels * device.launch_seconds
    gpu = kernels * device.kernel_seconds + matmuls * device.matmul_fill_seconds
    return {"host": host, "gpu": gpu, "eager": max(host, gpu), "graphs": gpu}


def q4() -> list[str]:
    r = tiny_step()
    assert r["host"] > r["gpu"]
    return [fmt(r["host"] * 1e3, "ms"), fmt(r["gpu"] * 1e3, "ms"),
            f"{r['eager'] / r['graphs']:.2f}x"]


ANSWERS = {"Q2": q2, "Q3": q3, "Q4": q4}
