"""What is emulated: devices in nodes, the links between them, and how they are charged.

A :class:`~.devices.Device` is one accelerator (:mod:`.devices`: its peaks
and what real kernels achieve of them). A :class:`Cluster` places devices
in nodes: ranks ``r // gpus_per_node`` share a node and talk over ``intra``
(NVLink); ranks in different nodes talk over ``inter`` (InfiniBand). It says
how it charges: ``charges="calibrated"`` (the default: per-kernel and launch
costs, achieved rates, NCCL's algorithms and protocols on the ``intra_fabric``
and ``inter_fabric`` constants, :mod:`.nccl`) or ``"roofline"`` (datasheet
peaks, and each link the alpha-beta model of Hockney 1994, ``alpha + n /
beta`` seconds for ``n`` bytes); ``launch`` (``"eager"`` or ``"graphs"``) and
``optimizer`` (``"foreach"``, ``"fused"``, ``"as-run"``) pick the GPU code path.

The alpha-beta links (and the devices' 16-bit peaks) are the cost model's own
(:mod:`lecture_lib.costmodel.comm`, :mod:`lecture_lib.costmodel.steptime`):
one set of numbers, so under the roofline charges the emulation and the
closed-form model disagree only where their *methods* differ. Only constants
are shared; the emulation never calls a cost-model formula. The calibrated
constants come from published measurements (:mod:`.published`), each named
where it is set below. The links' datasheet constants, with their sources:

* NVLink 4 (H100): 900 GB/s per GPU both ways = 450 GB/s each way (datasheet);
  the cost model takes the ~300 GB/s bus bandwidth NCCL reaches on 8 x H100,
  alpha = 3 us. NVLink 3 (A100): 600 GB/s both ways = 300 GB/s each way, taken
  as 200 GB/s achieved. InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU (one
  ConnectX-7 per GPU in a DGX H100), ~45 GB/s achieved, alpha = 10 us;
  HDR: 200 Gb/s = 25 GB/s per GPU, ~22 GB/s achieved (DGX A100 user guides).

fp32 tensors. The course computes in fp32 on CPUs; a real run computes its
matrix multiplies in bf16 (mixed precision, Micikevicius et al. 2018). A
cluster's ``fp32`` option says what an fp32 operation is charged as:
``"bf16"`` (the default, "as if mixed precision": the rate of bf16, and the
bytes of bf16 for every tensor outside the optimizer, as a mixed-precision
run's activations and operands; the optimizer's fp32 master weights and
states, and messages, keep their real bytes), ``"tf32"`` or ``"fp32"`` (what
an fp32 program would really get, at its real bytes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from ..costmodel.comm import INFINIBAND_HDR, INFINIBAND_NDR, NVLINK_A100, NVLINK_H100, Link
from ..costmodel.steptime import A100_CLUSTER, H100_CLUSTER
from . import nccl, published
from .devices import A100_SXM, H100_SXM, Device, positive
from .nccl import Fabric

FP32_MODES = ("bf16", "tf32", "fp32")
CHARGES = ("calibrated", "roofline")
LAUNCHES = ("eager", "graphs")
OPTIMIZERS = ("foreach", "fused", "as-run")


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
    charges: str = "calibrated"         # or "roofline": datasheet peaks, alpha-beta rings
    launch: str = "eager"               # or "graphs": CUDA graphs, no host cost per kernel
    optimizer: str = "foreach"          # the GPU's optimizer kernels: "foreach", "fused", "as-run"
    intra_fabric: Fabric | None = None  # NCCL's constants on ``intra`` / ``inter``
    inter_fabric: Fabric | None = None

    def __post_init__(self):
        if not isinstance(self.device, Device):
            raise TypeError(f"device must be an emulate.Device, not {type(self.device).__name__}")
        check_link(self.intra)
        check_link(self.inter)
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) \
                or self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be a whole number >= 1, "
                             f"not {self.gpus_per_node!r}")
        for key, allowed in (("fp32", FP32_MODES), ("charges", CHARGES),
                             ("launch", LAUNCHES), ("optimizer", OPTIMIZERS)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} must be one of {allowed}, not {getattr(self, key)!r}")
        if self.charges == "calibrated":
            for key in ("intra_fabric", "inter_fabric"):
                if not isinstance(getattr(self, key), Fabric):
                    raise ValueError(f"calibrated charges need {key} (an emulate.Fabric, "
                                     "NCCL's constants on that link); or charges='roofline'")

    @property
    def calibrated(self) -> bool:
        return self.charges == "calibrated"

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
        """E.g. "H100 + NVLink", with the charges named where they are not the default:
        "H100 + NVLink, CUDA graphs", "H100 + NVLink, roofline"; a node preset cut into
        smaller nodes says so: "H100 + NVLink (nodes of 4 GPUs, InfiniBand between them)"."""
        notes = ["roofline" if not self.calibrated else None,
                 "CUDA graphs" if self.calibrated and self.launch == "graphs" else None]
        name = self.short or self.name
        if "InfiniBand" not in name and self.gpus_per_node != 8:    # a node preset, re-cut
            name += f" (nodes of {self.gpus_per_node} GPU{'s' * (self.gpus_per_node > 1)}, " \
                    "InfiniBand between them)"
        return ", ".join([name] + [n for n in notes if n])

    def collective_seconds(self, kind: str, nbytes: float, ranks) -> float:
        """Seconds of one collective of ``kind`` over these global ranks: NCCL's fastest
        algorithm and protocol (calibrated), or the ideal ring (roofline)."""
        return self.collective_choice(kind, nbytes, ranks)[1]

    def collective_choice(self, kind: str, nbytes: float, ranks) -> tuple[str, float]:
        """``(algorithm/protocol, seconds)`` of one collective over these global ranks."""
        if not self.calibrated:
            return "ring", nccl.collective_seconds(kind, nbytes, len(ranks), self.link(ranks))
        nodes = len({self.node(r) for r in ranks})
        return nccl.nccl_choice(kind, nbytes, len(ranks), self.intra_fabric,
                                self.inter_fabric, nodes)

    def p2p_seconds(self, nbytes: float, ranks) -> float:
        """Seconds of one message between the two global ranks."""
        if not self.calibrated:
            return nccl.p2p_seconds(nbytes, self.link(ranks))
        one_node = len({self.node(r) for r in ranks}) <= 1
        return nccl.nccl_p2p_seconds(nbytes, self.intra_fabric if one_node
                                     else self.inter_fabric)


def check_link(link: Link) -> Link:
    """A link must have a latency >= 0 and a bandwidth > 0 (ValueError otherwise)."""
    if not isinstance(link, Link):
        raise TypeError(f"a link is a costmodel.Link, not {type(link).__name__}")
    positive(f"{link.name}: beta (bandwidth, bytes/s)", link.beta)
    if not math.isfinite(link.alpha) or link.alpha < 0:
        raise ValueError(f"{link.name}: alpha (latency, s) must be >= 0, not {link.alpha!r}")
    return link


def _fabrics() -> dict[str, Fabric]:
    """NCCL's constants per link (:mod:`.nccl`). The Simple ring's per-step latency and bus
    bandwidth go through the two ends of the A100 node's nccl-tests curve; NVLS's through
    the H200 node's; the H100's ring bandwidth is the ring measurement of NVIDIA/nccl issue
    1455 with the A100's per-step latency (no mid-size H100 ring figure is published with
    it). LL: tuning.cc (0.6 us per NVLink step, 2.7 us per network step; llMaxBw 87.7 GB/s
    Ampere, 141 GB/s Hopper in a node). InfiniBand: NDR 47 GB/s per NIC measured (nccl-tests
    issue 290), HDR at the same fraction of its 25 GB/s; tuning.cc's 14 us per network step."""
    a100, h200 = published.A100_ALLREDUCE, published.H200_ALLREDUCE
    step, ring = nccl.fit_line((a100[0].size, a100[0].value), (a100[-1].size, a100[-1].value),
                               nccl.steps("all_reduce", 8), nccl.SIMPLE_BASE)
    nvls_latency, nvls = nccl.fit_line((h200[0].size, h200[0].value),
                                       (h200[-1].size, h200[-1].value), 1, 0.0)
    us, gb = 1e-6, 1e9
    ndr = published.NDR_NIC.value
    return {
        "nvlink3": Fabric("NVLink 3 (A100 node)", ring, step, 87.7 * gb, 0.6 * us,
                          source="AZURE_A100 curve; tuning.cc"),
        "nvlink4": Fabric("NVLink 4 + NVLS (H100/H200 node)", published.H100_RING_1GB.value,
                          step, 141 * gb, 0.6 * us, nvls, nvls_latency,
                          source="NCCL_1455 ring; AZURE_H200 NVLS curve; tuning.cc"),
        "ndr": Fabric("InfiniBand NDR", ndr, 14 * us, 45 * gb, 2.7 * us,
                      source="NCCL_TESTS_290; tuning.cc"),
        "hdr": Fabric("InfiniBand HDR", ndr * 25 / 50, 14 * us, 22.5 * gb, 2.7 * us,
                      source="NCCL_TESTS_290 scaled to 200 Gb/s; tuning.cc"),
    }


FABRICS = _fabrics()
_H100 = dict(intra_fabric=FABRICS["nvlink4"], inter_fabric=FABRICS["ndr"])
_A100 = dict(intra_fabric=FABRICS["nvlink3"], inter_fabric=FABRICS["hdr"])

PRESETS: dict[str, Cluster] = {
    "h100-node": Cluster("8 x H100 SXM per node, NVLink 4, InfiniBand NDR", H100_SXM,
                         NVLINK_H100, INFINIBAND_NDR, H100_CLUSTER.gpus_per_node,
                         short="H100 + NVLink", **_H100),
    "a100-node": Cluster("8 x A100 SXM per node, NVLink 3, InfiniBand HDR", A100_SXM,
                         NVLINK_A100, INFINIBAND_HDR, A100_CLUSTER.gpus_per_node,
                         short="A100 + NVLink", **_A100),
    # One GPU per node: every message crosses InfiniBand (the "slow network" lesson).
    "h100-ib": Cluster("H100 SXM, one per node, InfiniBand NDR between them", H100_SXM,
                       NVLINK_H100, INFINIBAND_NDR, 1, short="H100 + InfiniBand", **_H100),
    "a100-ib": Cluster("A100 SXM, one per node, InfiniBand HDR between them", A100_SXM,
                       NVLINK_A100, INFINIBAND_HDR, 1, short="A100 + InfiniBand", **_A100),
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
