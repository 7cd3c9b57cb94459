"""The data-parallel notebook's hand calculations: global batch, per-call latency, bucket size.

* Q2: the global batch identity ``B = b x m x dp`` (micro-batch, accumulation steps,
  data-parallel degree; Goyal et al. 2017 train with the global batch as the unit;
  PyTorch DDP's ``no_sync`` accumulates micro-batches locally).
* Q3: the latency of ``naive`` DDP, one ring all-reduce per parameter tensor against one
  flat all-reduce: ``2 (p-1) alpha`` each (Thakur et al. 2005; ``costmodel.collective_time``
  with zero bytes).
* Q4: CS336's bucket model, best bucket ``sqrt(n w o)`` for ``n`` bytes of gradients
  (``costmodel.best_bucket_bytes``), with the ring's ``o = 2 (p-1) alpha`` and
  ``w = beta p / (2 (p-1))`` on NVLink, so ``n w o = n alpha beta p``.
* Q5 (what if): the same model on half the GPUs: the best bucket scales as ``sqrt(p)``.
"""
from __future__ import annotations

import math

from ..costmodel import NVLINK_H100, best_bucket_bytes, collective_time
from ..models import GPT, GPTConfig
from . import fmt

MICRO_BATCH, ACCUMULATION, DP, SEQ_LEN = 4, 16, 64, 2048
BUCKET_MODEL_PARAMS, BUCKET_GRAD_BYTES = 7e9, 2     # a 7B model, bf16 gradients
BUCKET_GPUS, WHAT_IF_GPUS = 8, 4                    # one H100 node; then half of it


def global_batch(microbatch_size: int, accumulation: int, dp: int) -> int:
    """Sequences per optimizer step: each of dp ranks adds up ``accumulation`` micro-batches."""
    return microbatch_size * accumulation * dp


def ring_bucket_constants(p: int, link=NVLINK_H100) -> tuple[float, float]:
    """``(o, w)`` of the bucket model for a ring all-reduce over ``p`` ranks on ``link``:
    ``o = 2 (p-1) alpha`` (s per call), ``w = beta p / (2 (p-1))`` (bytes/s)."""
    return 2 * (p - 1) * link.alpha, link.beta * p / (2 * (p - 1))


def best_ring_bucket(model_bytes: float, p: int, link=NVLINK_H100) -> float:
    """The bucket model's best bucket (bytes) for a ring over ``p`` ranks on ``link``."""
    o, w = ring_bucket_constants(p, link)
    return best_bucket_bytes(model_bytes, w, o)


def q2() -> list[str]:
    sequences = global_batch(MICRO_BATCH, ACCUMULATION, DP)
    return [f"{sequences:,} sequences", f"{sequences * SEQ_LEN / 1e6:.3g} million tokens"]


def q3() -> list[str]:
    tensors = len(list(GPT(GPTConfig()).parameters()))
    one = collective_time("all_reduce", 0, 4, NVLINK_H100)
    return [f"{tensors} tensors", fmt(tensors * one * 1e3, "ms"), fmt(one * 1e6, "us")]


def q4() -> list[str]:
    n = BUCKET_MODEL_PARAMS * BUCKET_GRAD_BYTES
    o, w = ring_bucket_constants(BUCKET_GPUS)
    return [fmt(n / 1e9, "GB"), fmt(o * 1e6, "us"), fmt(w / 1e9, "GB/s"),
            fmt(best_ring_bucket(n, BUCKET_GPUS) / 1e6, "MB")]


def q5() -> list[str]:
    n = BUCKET_MODEL_PARAMS * BUCKET_GRAD_BYTES
    o, w = ring_bucket_constants(WHAT_IF_GPUS)
    full, half = best_ring_bucket(n, BUCKET_GPUS), best_ring_bucket(n, WHAT_IF_GPUS)
    assert math.isclose(full / half, math.sqrt(BUCKET_GPUS / WHAT_IF_GPUS))
    return [fmt(o * 1e6, "us"), fmt(w / 1e9, "GB/s"), fmt(half / 1e6, "MB"),
            f"{full / half:.2f}x"]


ANSWERS = {"Q2": q2, "Q3": q3, "Q4": q4, "Q5": q5}
