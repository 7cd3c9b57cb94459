"""The emulated data-parallel notebook: when backward hides DDP's all-reduces; the ring.

* Q1: backward hides all but the last bucket when ``t_bwd >= t_comm - t_last`` (times in
  seconds); with ``t_bwd = t_token x T``, ``T`` tokens per rank, that is
  ``T >= (t_comm - t_last) / t_token``.
  Backward costs ``4 N`` FLOPs per token (twice the forward's ``2 N``; Kaplan et al. 2020),
  run at ``EFFICIENCY`` of the H100's dense bf16 peak (``costmodel.H100_BF16_FLOPS``); each
  bucket's all-reduce costs the ring's ``2 (p-1) alpha + 2 (p-1)/p n / beta`` on NVLink
  (``costmodel.collective_time``, ``costmodel.NVLINK_H100``).
* Q2: the two terms of the ring all-reduce at p = 2, 4, 8, and how much the whole all-reduce
  grows from 4 to 8 GPUs.
* Q5 (what if): NCCL's choice for one bucket of torch's default size on 8 and on 2 GPUs of
  the emulated H100 node (``bucket_cap_mb=25``: torch multiplies it by 2**20, so 25 MiB;
  ``lecture_lib.emulate.nccl``: the Simple ring pays a latency per step, ``2 (p-1)`` steps;
  NVLS one fixed latency; both move the same bus bytes).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..costmodel import H100_BF16_FLOPS, NVLINK_H100, collective_time
from ..emulate import FABRICS, nccl
from . import fmt

PARAMS, GRAD_BYTES, BUCKET_BYTES, GPUS, EFFICIENCY = 1e9, 2, 25e6, 8, 0.5
RING_BYTES, RING_SIZES = 100e6, (2, 4, 8)
NCCL_BUCKET, NCCL_SIZES = 25 * 2**20, (8, 2)      # torch's default bucket_cap_mb=25: MiB


def hiding_threshold() -> dict:
    """t_comm, t_last, backward seconds per token, and the tokens per rank that hide the rest."""
    total = PARAMS * GRAD_BYTES
    buckets = math.ceil(total / BUCKET_BYTES)
    last = total - (buckets - 1) * BUCKET_BYTES
    t_comm = ((buckets - 1) * collective_time("all_reduce", BUCKET_BYTES, GPUS, NVLINK_H100)
              + collective_time("all_reduce", last, GPUS, NVLINK_H100))
    t_last = collective_time("all_reduce", last, GPUS, NVLINK_H100)
    per_token = 4 * PARAMS / (EFFICIENCY * H100_BF16_FLOPS)
    return {"buckets": buckets, "t_comm": t_comm, "t_last": t_last, "per_token": per_token,
            "tokens": (t_comm - t_last) / per_token}


def q1() -> list[str]:
    r = hiding_threshold()
    return [f"{r['buckets']} buckets", fmt(r["t_comm"] * 1e3, "ms"), fmt(r["t_last"] * 1e6, "us"),
            fmt(r["per_token"] * 1e6, "us"), f"{math.ceil(r['tokens']):,} tokens"]


def q2() -> list[str]:
    out, total = [], {}
    for p in RING_SIZES:
        latency = collective_time("all_reduce", 0, p, NVLINK_H100)
        total[p] = collective_time("all_reduce", RING_BYTES, p, NVLINK_H100)
        out += [fmt(latency * 1e6, "us"), fmt((total[p] - latency) * 1e3, "ms")]
    # the whole all-reduce on 4 and on 8 GPUs, and how much it grows when the ranks double
    return out + [fmt(total[4] * 1e3, "ms"), fmt(total[8] * 1e3, "ms"),
                  f"{total[8] / total[4]:.2f}x"]


def ring_and_nvls(nbytes: float, p: int, fabric=FABRICS["nvlink4"]) -> dict:
    """Emulated seconds of one all-reduce of ``nbytes`` on ``p`` GPUs of one node: NCCL's
    choice, the best ring (LL or Simple: the same fabric without NVLS) and NVLS."""
    ring = nccl.nccl_choice("all_reduce", nbytes, p, replace(fabric, nvls_busbw=0.0,
                                                              nvls_latency=0.0))
    nvls = fabric.nvls_latency + nccl.bus_bytes("all_reduce", nbytes, p) / fabric.nvls_busbw
    return {"choice": nccl.nccl_choice("all_reduce", nbytes, p, fabric), "ring": ring,
            "nvls": nvls}


def q5() -> list[str]:
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


ANSWERS = {"Q1": q1, "Q2": q2, "Q5": q5}
