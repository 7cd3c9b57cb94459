"""The emulated data-parallel notebook: when backward hides DDP's all-reduces; the ring.

* Q1: backward hides all but the last bucket when ``T_bwd >= T_comm - T_last``; with
  ``T_bwd = t_tok x tokens per rank`` that is ``tokens >= (T_comm - T_last) / t_tok``.
  Backward costs ``4 N`` FLOPs per token (twice the forward's ``2 N``; Kaplan et al. 2020),
  run at ``EFFICIENCY`` of the H100's dense bf16 peak (``costmodel.H100_BF16_FLOPS``); each
  bucket's all-reduce costs the ring's ``2 (p-1) alpha + 2 (p-1)/p n / beta`` on NVLink
  (``costmodel.collective_time``, ``costmodel.NVLINK_H100``).
* Q2: the two terms of the ring all-reduce at p = 2, 4, 8.
"""
from __future__ import annotations

import math

from ..costmodel import H100_BF16_FLOPS, NVLINK_H100, collective_time
from . import fmt

PARAMS, GRAD_BYTES, BUCKET_BYTES, GPUS, EFFICIENCY = 1e9, 2, 25e6, 8, 0.5
RING_BYTES, RING_SIZES = 100e6, (2, 4, 8)


def hiding_threshold() -> dict:
    """T_comm, T_last, backward seconds per token, and the tokens per rank that hide the rest."""
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
    out = []
    for p in RING_SIZES:
        latency = collective_time("all_reduce", 0, p, NVLINK_H100)
        out += [fmt(latency * 1e6, "us"),
                fmt((collective_time("all_reduce", RING_BYTES, p, NVLINK_H100) - latency) * 1e3,
                    "ms")]
    return out


ANSWERS = {"Q1": q1, "Q2": q2}
