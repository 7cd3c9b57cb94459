"""Published measurements of real GPUs: what the emulation is calibrated on and checked against.

Each :class:`Anchor` is one published figure, with where it comes from. The
emulation's constants (:mod:`.presets`, :mod:`.nccl`) are derived from *some* of
them, named in ``FITTED`` below (two points of a curve fix its two constants);
every other anchor is a check the emulation did not see. The course's
calibration table (:mod:`lecture_lib.calibration.published`) sets each anchor
beside what the emulation charges for it.

Sources
-------
* AZURE_H200 / AZURE_A100: the Azure AI benchmarking guide's result files
  (github.com/Azure/AI-benchmarking-guide), nccl-tests ``all_reduce_perf`` on
  one node of 8 GPUs: ND H200 v5 (NVLink 4, NVLS, NCCL 2.20.5) and ND A100 v4
  (NVLink 3, NCCL 2.18.5); bus bandwidth in GB/s. The A100 file also gives the
  cuBLASLt FP16 GEMM rates and the STREAM-like HBM bandwidth.
* NCCL_1455: NVIDIA/nccl issue 1455 and nccl-tests issue 212: 8 x H100 with
  the ring algorithm (NVLS off) reach about 365-370 GB/s bus bandwidth at GB sizes.
* NCCL_TESTS_290: nccl-tests issue 290: InfiniBand NDR, about 46-48 GB/s per NIC.
* H200_HBM: H200 HBM3e measured at 4.0-4.5 TB/s of the 4.8 TB/s datasheet figure.
* LLMC: llm.c's GPT-2 124M on 8 x H100 SXM, bf16, 64 x 1024 tokens per GPU,
  median 139 ms per step (KellerJordan/modded-nanogpt, records/101324_llmc).
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
MB = 2 ** 20          # nccl-tests sizes are powers of two: "16 MB" is 2^24 bytes


@dataclass(frozen=True)
class Anchor:
    """One published figure: what was measured, at what size, the value and its unit."""
    key: str
    what: str
    size: float           # bytes of the message, or FLOPs-defining size (see ``what``)
    value: float          # in ``unit``
    unit: str
    source: str


def _allreduce(system: str, source: str, points) -> list[Anchor]:
    return [Anchor(f"{system} all-reduce {label}", f"8-GPU all-reduce bus bandwidth, {system}",
                   size, busbw * GB, "B/s", source) for label, size, busbw in points]


H200_ALLREDUCE = _allreduce("H200 node", "AZURE_H200", [
    ("16 MB", 16 * MB, 240), ("32 MB", 32 * MB, 301), ("64 MB", 64 * MB, 368),
    ("1 GB", 1024 * MB, 468), ("8 GB", 8192 * MB, 480)])
A100_ALLREDUCE = _allreduce("A100 node", "AZURE_A100", [
    ("16 MB", 16 * MB, 109), ("32 MB", 32 * MB, 133), ("64 MB", 64 * MB, 167),
    ("256 MB", 256 * MB, 214), ("1 GB", 1024 * MB, 228), ("8 GB", 8192 * MB, 232)])
H100_RING_1GB = Anchor("H100 node ring all-reduce 1 GB", "8-GPU all-reduce bus bandwidth, "
                       "ring algorithm (NVLS off)", 1024 * MB, 367 * GB, "B/s", "NCCL_1455")
NDR_NIC = Anchor("InfiniBand NDR per NIC", "bus bandwidth across nodes, one NIC per GPU",
                 1024 * MB, 47 * GB, "B/s", "NCCL_TESTS_290")
A100_GEMM_PEAK = Anchor("A100 FP16 GEMM, best", "cuBLASLt FP16 GEMM, best size (8192^3)",
                        8192, 256.5e12, "FLOP/s", "AZURE_A100")
A100_GEMM_1024 = Anchor("A100 FP16 GEMM 1024^3", "cuBLASLt FP16 GEMM, m = n = k = 1024",
                        1024, 119e12, "FLOP/s", "AZURE_A100")
A100_HBM = Anchor("A100 HBM", "STREAM-like copy bandwidth (1.61-1.75 TB/s; the middle)",
                  0, 1.68e12, "B/s", "AZURE_A100")
H200_HBM = Anchor("H200 HBM", "HBM3e bandwidth measured (4.0-4.5 TB/s; the middle)", 0,
                  4.25e12, "B/s", "H200_HBM")
LLMC_STEP = Anchor("llm.c GPT-2 124M step", "GPT-2 124M, 8 x H100, bf16, 64 x 1024 tokens "
                   "per GPU: seconds per step", 124e6, 0.139, "s", "LLMC")

# The anchors the emulation's constants are derived from (each curve's two ends; the
# device efficiencies from the best measured rates). Everything else is a check.
FITTED = {a.key for a in (H200_ALLREDUCE[0], H200_ALLREDUCE[-1], A100_ALLREDUCE[0],
                          A100_ALLREDUCE[-1], H100_RING_1GB, NDR_NIC, A100_GEMM_PEAK,
                          A100_HBM, H200_HBM)}

ANCHORS = [*H200_ALLREDUCE, *A100_ALLREDUCE, H100_RING_1GB, NDR_NIC, A100_GEMM_PEAK,
           A100_GEMM_1024, A100_HBM, H200_HBM, LLMC_STEP]
