"""The data-parallel notebook's hand calculations: global batch, per-call latency, bucket size.

* Q2: the global batch identity ``B_global = micro-batch x accumulation steps x dp``
  (Goyal et al. 2017 train with the global batch as the unit; PyTorch DDP's
  ``no_sync`` accumulates micro-batches locally).
* Q3: the latency of ``naive`` DDP, one ring all-reduce per parameter tensor against one
  flat all-reduce: ``2 (p-1) alpha`` each (Thakur et al. 2005; ``costmodel.collective_time``
  with zero bytes).
* Q4: CS336's bucket model, best bucket ``sqrt(s w o)`` (``costmodel.best_bucket_bytes``).
"""
from __future__ import annotations

from ..costmodel import NVLINK_H100, best_bucket_bytes, collective_time
from ..models import GPT, GPTConfig
from . import fmt

MICRO_BATCH, ACCUMULATION, DP, SEQ_LEN = 4, 16, 64, 2048
BUCKET_MODEL_PARAMS, BUCKET_GRAD_BYTES = 7e9, 2     # a 7B model, bf16 gradients


def global_batch(microbatch_size: int, accumulation: int, dp: int) -> int:
    """Sequences per optimizer step: each of dp ranks adds up ``accumulation`` micro-batches."""
    return microbatch_size * accumulation * dp


def q2() -> list[str]:
    sequences = global_batch(MICRO_BATCH, ACCUMULATION, DP)
    return [f"{sequences:,} sequences", f"{sequences * SEQ_LEN / 1e6:.3g} million tokens"]


def q3() -> list[str]:
    tensors = len(list(GPT(GPTConfig()).parameters()))
    one = collective_time("all_reduce", 0, 4, NVLINK_H100)
    return [f"{tensors} tensors", fmt(tensors * one * 1e3, "ms"), fmt(one * 1e6, "us")]


def q4() -> list[str]:
    s = BUCKET_MODEL_PARAMS * BUCKET_GRAD_BYTES
    return [fmt(s / 1e9, "GB"),
            fmt(best_bucket_bytes(s, NVLINK_H100.beta, NVLINK_H100.alpha) / 1e6, "MB")]


ANSWERS = {"Q2": q2, "Q3": q3, "Q4": q4}
