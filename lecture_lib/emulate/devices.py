"""What is emulated: an accelerator, its datasheet peaks and what real kernels achieve of them.

A :class:`Device` is one accelerator: its datasheet peaks (the roofline of
Williams, Waterman & Patterson 2009: ``F`` FLOPs and ``B`` bytes take
``max(F / rate, B / memory_bandwidth)``) and what real kernels achieve of
them, the calibrated charges of :mod:`.kernels`: a matmul's share of the peak
and its fill, the HBM's share, a kernel's least time and its launch, the flash
attention kernel's rates. The 16-bit peaks are the cost model's own
(:mod:`lecture_lib.costmodel.steptime`). The datasheets:

* H100 SXM: 989 TFLOP/s dense bf16/fp16 tensor core, 494 TFLOP/s dense TF32,
  67 TFLOP/s fp32 (non tensor core), 3.35 TB/s HBM3 (NVIDIA H100 Tensor Core
  GPU datasheet, SXM column; the datasheet's 1979/989 figures are "with
  sparsity", half of them dense).
* A100 SXM 80GB: 312 TFLOP/s dense bf16/fp16, 156 TFLOP/s dense TF32,
  19.5 TFLOP/s fp32, 2.039 TB/s HBM2e (NVIDIA A100 Tensor Core GPU datasheet).

The achieved rates come from published measurements (:mod:`.published`),
each named where it is set below (``fitted`` in the course's calibration table).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..costmodel.steptime import A100_CLUSTER, H100_CLUSTER
from . import published
from .kernels import (
    FlashAttention,
    fit_efficiency,
    fit_flash_attention,
    fit_gemm,
    forward_backward_share,
)


@dataclass(frozen=True)
class Device:
    """One accelerator: dense FLOP/s by precision, memory bandwidth in bytes/s (datasheet),
    and what real kernels achieve of them (the calibrated charges, :mod:`.kernels`)."""
    name: str
    bf16_flops: float
    tf32_flops: float
    fp32_flops: float
    memory_bandwidth: float
    source: str = ""
    sms: int = 1                        # streaming multiprocessors: a wave of matmul tiles
    matmul_efficiency: float = 1.0      # best measured matmul rate / peak
    memory_efficiency: float = 1.0      # measured HBM bandwidth / datasheet
    kernel_seconds: float = 0.0         # the least time a kernel occupies the GPU
    launch_seconds: float = 0.0         # host time to launch one operation, eager PyTorch
    matmul_fill_seconds: float = 0.0    # a matmul's least time beyond a kernel's
    attention: FlashAttention | None = None   # its rates (None: attention at the matmul's)

    def __post_init__(self):
        for key in ("bf16_flops", "tf32_flops", "fp32_flops", "memory_bandwidth",
                    "matmul_efficiency", "memory_efficiency"):
            positive(f"{self.name}: {key}", getattr(self, key))
        for key in ("matmul_efficiency", "memory_efficiency"):
            if getattr(self, key) > 1:
                raise ValueError(f"{self.name}: {key} is a fraction of the peak, <= 1")
        for key in ("kernel_seconds", "launch_seconds", "matmul_fill_seconds"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or value < 0:
                raise ValueError(f"{self.name}: {key} must be >= 0, not {value!r}")
        if isinstance(self.sms, bool) or not isinstance(self.sms, int) or self.sms < 1:
            raise ValueError(f"{self.name}: sms must be a whole number >= 1, not {self.sms!r}")
        if self.attention is not None and not isinstance(self.attention, FlashAttention):
            raise TypeError(f"{self.name}: attention is an emulate.FlashAttention or None")


# What real kernels achieve (the calibrated charges). Memory: the middle of the measured HBM
# ranges (A100 1.61-1.75 of 2.039 TB/s; H200 4.0-4.5 of 4.8 TB/s, the fraction taken for the
# H100's HBM3 too). A kernel occupies the GPU at least 2.5 us (launch latency to its first
# instruction, one wave and its tail: a CUDA kernel's launch costs 4-6 us of host time back to
# back, of which the GPU sees about half, NVIDIA's "Getting Started with CUDA Graphs" and
# pegainfer's launch-overhead measurements); eager PyTorch spends 5 us of host time per
# operation (the runtime's launch plus the dispatcher; PyTorch's operator micro-benchmarks time
# 3.3 us for a Python call of an op that launches nothing). SMs: 132 (H100 SXM), 108 (A100).
KERNEL_SECONDS, LAUNCH_SECONDS = 2.5e-6, 5e-6


def _h100() -> Device:
    """The H100 SXM: matmuls through XLA's measured H100 GEMMs (its largest sets the
    efficiency, its smallest a matmul's fill); attention through FlashAttention-2's
    measured forward and backward rates (:func:`.kernels.fit_flash_attention`)."""
    base = Device("H100 SXM", bf16_flops=H100_CLUSTER.peak_flops, tf32_flops=494e12,
                  fp32_flops=67e12, memory_bandwidth=3.35e12,
                  source="NVIDIA H100 Tensor Core GPU datasheet (SXM, dense)", sms=132,
                  memory_efficiency=published.H200_HBM.value / 4.8e12,
                  kernel_seconds=KERNEL_SECONDS, launch_seconds=LAUNCH_SECONDS)
    big, small = ((a.shape, a.value) for a in published.H100_GEMMS[:2])
    efficiency, fill = fit_gemm(base, big, small)
    rates = {a.shape: a.value for a in published.H100_FA2_FORWARD + published.H100_FA2_BACKWARD
             if a.key in published.FITTED}
    attention = fit_flash_attention("FlashAttention-2 (H100)", rates, base.bf16_flops, base.sms,
                                    "FA3_PAPER")
    return replace(base, matmul_efficiency=efficiency, matmul_fill_seconds=fill,
                   attention=attention)


def _a100(h100: Device) -> Device:
    """The A100 SXM 80GB: the matmul efficiency through cuBLASLt's best GEMM, the H100's fill
    (no small A100 GEMM is among the anchors); FlashAttention-2 the H100's shape of rates at
    the share of the peak its measured forward and backward reach (FA2_PAPER)."""
    base = Device("A100 SXM 80GB", bf16_flops=A100_CLUSTER.peak_flops, tf32_flops=156e12,
                  fp32_flops=19.5e12, memory_bandwidth=2.039e12,
                  source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB, dense)", sms=108,
                  memory_efficiency=published.A100_HBM.value / 2.039e12,
                  kernel_seconds=KERNEL_SECONDS, launch_seconds=LAUNCH_SECONDS,
                  matmul_fill_seconds=h100.matmul_fill_seconds)
    best = published.A100_GEMM_PEAK
    efficiency = fit_efficiency(base, ((1, best.size, best.size, best.size), best.value),
                                base.matmul_fill_seconds)
    anchor, fa = published.A100_FA2[0], h100.attention
    _, head_dim, keys, causal = anchor.shape
    scale = anchor.value / (base.bf16_flops * forward_backward_share(fa, head_dim, keys, causal))
    attention = replace(fa, name="FlashAttention-2 (A100)", source="FA2_PAPER",
                        forward=tuple((d, share * scale) for d, share in fa.forward),
                        backward=tuple((d, share * scale) for d, share in fa.backward))
    return replace(base, matmul_efficiency=efficiency, attention=attention)


def positive(name: str, value) -> float:
    """``value`` as a float, or ValueError unless it is a positive finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, not {value!r}")
    return float(value)


H100_SXM = _h100()
A100_SXM = _a100(H100_SXM)
