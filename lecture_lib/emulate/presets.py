"""What is emulated: a device (its FLOP rates and memory bandwidth) and the links between devices.

A :class:`Device` is the roofline of one accelerator (Williams, Waterman &
Patterson 2009, "Roofline: an insightful visual performance model"): an
operation that does ``F`` FLOPs and moves ``B`` bytes to and from memory takes
``max(F / rate, B / memory_bandwidth)``. A :class:`Cluster` places devices in
nodes: ranks ``r // gpus_per_node`` share a node and talk over ``intra``
(NVLink); ranks in different nodes talk over ``inter`` (InfiniBand). Each link
is the alpha-beta model (Hockney 1994): ``alpha + n / beta`` seconds for
``n`` bytes.

The link constants and the 16-bit peak rates are the cost model's own
(:mod:`lecture_lib.costmodel.comm`, :mod:`lecture_lib.costmodel.steptime`):
one set of numbers, so the emulation and the closed-form model disagree only
where their *methods* differ. Only constants are shared; the emulation never
calls a cost-model formula. The constants, with their sources:

* H100 SXM: 989 TFLOP/s dense bf16/fp16 tensor core, 494 TFLOP/s dense TF32,
  67 TFLOP/s fp32 (non tensor core), 3.35 TB/s HBM3 (NVIDIA H100 Tensor Core
  GPU datasheet, SXM column; the datasheet's 1979/989 figures are "with
  sparsity", half of them dense).
* A100 SXM 80GB: 312 TFLOP/s dense bf16/fp16, 156 TFLOP/s dense TF32,
  19.5 TFLOP/s fp32, 2.039 TB/s HBM2e (NVIDIA A100 Tensor Core GPU datasheet).
* NVLink 4 (H100): 900 GB/s per GPU both ways = 450 GB/s each way (datasheet);
  the cost model takes the ~300 GB/s bus bandwidth NCCL reaches on 8 x H100,
  alpha = 3 us. NVLink 3 (A100): 600 GB/s both ways = 300 GB/s each way, taken
  as 200 GB/s achieved. InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU (one
  ConnectX-7 per GPU in a DGX H100), ~45 GB/s achieved, alpha = 10 us;
  HDR: 200 Gb/s = 25 GB/s per GPU, ~22 GB/s achieved (DGX A100 user guides).

fp32 tensors. The course computes in fp32 on CPUs; a real run computes its
matrix multiplies in bf16 (mixed precision, Micikevicius et al. 2018). A
cluster's ``fp32`` option says what rate an fp32 operation is charged at:
``"bf16"`` (the default, "as if mixed precision": the matmuls of a real bf16
run), ``"tf32"`` or ``"fp32"`` (what an fp32 program would really get). Bytes
are always the real ones: fp32 master weights, gradients and messages are
fp32 in a mixed-precision run too, while its bf16 activations would move half
the bytes the emulation charges for them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from ..costmodel.comm import INFINIBAND_HDR, INFINIBAND_NDR, NVLINK_A100, NVLINK_H100, Link
from ..costmodel.steptime import A100_CLUSTER, H100_CLUSTER

FP32_MODES = ("bf16", "tf32", "fp32")


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class Device:
    """One accelerator: dense FLOP/s by precision and memory bandwidth in bytes/s."""
    name: str
    bf16_flops: float
    tf32_flops: float
    fp32_flops: float
    memory_bandwidth: float
    source: str = ""

    def __post_init__(self):
        for key in ("bf16_flops", "tf32_flops", "fp32_flops", "memory_bandwidth"):
            _positive(f"{self.name}: {key}", getattr(self, key))


def check_link(link: Link) -> Link:
    """A link must have a latency >= 0 and a bandwidth > 0 (ValueError otherwise)."""
    if not isinstance(link, Link):
        raise TypeError(f"a link is a costmodel.Link, not {type(link).__name__}")
    _positive(f"{link.name}: beta (bandwidth, bytes/s)", link.beta)
    if not math.isfinite(link.alpha) or link.alpha < 0:
        raise ValueError(f"{link.name}: alpha (latency, s) must be >= 0, not {link.alpha!r}")
    return link


@dataclass(frozen=True)
class Cluster:
    """Devices in nodes of ``gpus_per_node``, ``intra`` links inside a node, ``inter`` across."""
    name: str
    device: Device
    intra: Link
    inter: Link
    gpus_per_node: int = 8
    fp32: str = "bf16"
    short: str = field(default="", compare=False)   # for labels: "H100 + NVLink"

    def __post_init__(self):
        if not isinstance(self.device, Device):
            raise TypeError(f"device must be an emulate.Device, not {type(self.device).__name__}")
        check_link(self.intra)
        check_link(self.inter)
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) \
                or self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be a whole number >= 1, "
                             f"not {self.gpus_per_node!r}")
        if self.fp32 not in FP32_MODES:
            raise ValueError(f"fp32 must be one of {FP32_MODES}, not {self.fp32!r}")

    def flops(self, dtype: torch.dtype) -> float:
        """The FLOP rate an operation producing ``dtype`` is charged at."""
        d = self.device
        if dtype in (torch.bfloat16, torch.float16):
            return d.bf16_flops
        if dtype == torch.float32:
            return {"bf16": d.bf16_flops, "tf32": d.tf32_flops, "fp32": d.fp32_flops}[self.fp32]
        return d.fp32_flops

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def link(self, ranks) -> Link:
        """The slowest link a ring over these global ranks crosses."""
        nodes = {self.node(r) for r in ranks}
        return self.intra if len(nodes) <= 1 else self.inter

    def label(self) -> str:
        return self.short or self.name

    def collective_seconds(self, kind: str, nbytes: float, ranks) -> float:
        """Seconds of one collective of ``kind`` over these global ranks."""
        from .nccl import collective_seconds
        return collective_seconds(kind, nbytes, len(ranks), self.link(ranks))

    def p2p_seconds(self, nbytes: float, ranks) -> float:
        """Seconds of one message between the two global ranks."""
        from .nccl import p2p_seconds
        return p2p_seconds(nbytes, self.link(ranks))


H100_SXM = Device("H100 SXM", bf16_flops=H100_CLUSTER.peak_flops, tf32_flops=494e12,
                  fp32_flops=67e12, memory_bandwidth=3.35e12,
                  source="NVIDIA H100 Tensor Core GPU datasheet (SXM, dense)")
A100_SXM = Device("A100 SXM 80GB", bf16_flops=A100_CLUSTER.peak_flops, tf32_flops=156e12,
                  fp32_flops=19.5e12, memory_bandwidth=2.039e12,
                  source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB, dense)")

PRESETS: dict[str, Cluster] = {
    "h100-node": Cluster("8 x H100 SXM per node, NVLink 4, InfiniBand NDR", H100_SXM,
                         NVLINK_H100, INFINIBAND_NDR, H100_CLUSTER.gpus_per_node,
                         short="H100 + NVLink"),
    "a100-node": Cluster("8 x A100 SXM per node, NVLink 3, InfiniBand HDR", A100_SXM,
                         NVLINK_A100, INFINIBAND_HDR, A100_CLUSTER.gpus_per_node,
                         short="A100 + NVLink"),
    # One GPU per node: every message crosses InfiniBand (the "slow network" lesson).
    "h100-ib": Cluster("H100 SXM, one per node, InfiniBand NDR between them", H100_SXM,
                       NVLINK_H100, INFINIBAND_NDR, 1, short="H100 + InfiniBand"),
    "a100-ib": Cluster("A100 SXM, one per node, InfiniBand HDR between them", A100_SXM,
                       NVLINK_A100, INFINIBAND_HDR, 1, short="A100 + InfiniBand"),
}


def preset(spec, **changes) -> Cluster:
    """A :class:`Cluster` from a preset name or a Cluster, with fields changed (validated).

    >>> preset("h100-node", fp32="tf32", gpus_per_node=4)
    """
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ValueError(f"unknown emulation preset {spec!r}; known: {sorted(PRESETS)}")
        spec = PRESETS[spec]
    if not isinstance(spec, Cluster):
        raise TypeError(f"an emulation preset is a name or an emulate.Cluster, "
                        f"not {type(spec).__name__}")
    return replace(spec, **changes) if changes else spec
