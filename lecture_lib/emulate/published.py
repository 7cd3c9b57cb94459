"""Published measurements of real GPUs: what the emulation is calibrated on and checked against.

Each :class:`Anchor` is one published figure, with where it comes from. The
emulation's constants (:mod:`.devices`, :mod:`.presets`, :mod:`.nccl`) are
derived from *some* of them, named in ``FITTED`` below (two points of a curve
fix its two constants); every other anchor is a check the emulation did not see. The course's
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
* XLA_SM90: XLA's GPU cost-model table of measured GEMMs (openxla/xla,
  ``xla/service/gpu/model/matmul_interpolator_data.h`` at commit b2766086ecf9,
  entries ``sm_90``, ``bf16xbf16->bf16``): the FLOP/s of one ``b x (m x k) @
  (k x n)`` matmul on an H100 SXM, from CUPTI kernel durations (median of 5 runs).
* FA3_PAPER: Shah et al. 2024, "FlashAttention-3" (arXiv 2407.08608), Fig. 5
  (forward) and Fig. 6 (backward): the FlashAttention-2 bars, H100 80GB SXM5,
  FP16, batch x sequence = 16k tokens, hidden size 2048 (2048 / head dim heads);
  FLOPs as torch's SDPA formulas count them, halved with the causal mask.
* FA2_PAPER: Dao 2023, "FlashAttention-2" (arXiv 2307.08691), Fig. 4: forward
  + backward, A100 80GB SXM4, the same shapes and FLOPs.
* FA2_H100: the same figure measured on an H100 80GB SXM5 (the FlashAttention
  repository, Dao-AILab/flash-attention, ``assets/flash2_h100_fwd_bwd_benchmark.png``).
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
MB = 2 ** 20          # nccl-tests sizes are powers of two: "16 MB" is 2^24 bytes


# Where each anchor's figure was published (the module docstring says more of each).
SOURCES = {
    "AZURE_H200": "Azure AI benchmarking guide (github.com/Azure/AI-benchmarking-guide), "
                  "nccl-tests all_reduce_perf on ND H200 v5",
    "AZURE_A100": "Azure AI benchmarking guide (github.com/Azure/AI-benchmarking-guide), "
                  "ND A100 v4: nccl-tests, cuBLASLt FP16 GEMM, HBM bandwidth",
    "NCCL_1455": "NVIDIA/nccl issue 1455 and nccl-tests issue 212: 8 x H100, ring algorithm",
    "NCCL_TESTS_290": "NVIDIA/nccl-tests issue 290: InfiniBand NDR per NIC",
    "H200_HBM": "H200 HBM3e measured at 4.0-4.5 of the datasheet's 4.8 TB/s",
    "LLMC": "KellerJordan/modded-nanogpt, records/101324_llmc: llm.c GPT-2 124M on 8 x H100",
    "XLA_SM90": "H100 GEMM kernel times XLA measured with CUPTI for its cost model: openxla/xla, "
                "xla/service/gpu/model/matmul_interpolator_data.h (sm_90, bf16)",
    "FA3_PAPER": "Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608), Figs. 5-6: "
                 "FlashAttention-2 on H100",
    "FA2_PAPER": "Dao 2023, FlashAttention-2 (arXiv 2307.08691), Fig. 4: A100",
    "FA2_H100": "Dao-AILab/flash-attention, assets/flash2_h100_fwd_bwd_benchmark.png",
}


@dataclass(frozen=True)
class Anchor:
    """One published figure: what was measured, at what size, the value and its unit."""
    key: str
    what: str
    size: float           # bytes of the message, or FLOPs-defining size (see ``what``)
    value: float          # in ``unit``
    unit: str
    source: str
    shape: tuple = ()     # a GEMM's (b, m, n, k); an attention's (pass, head dim, tokens, causal)


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


def _gemms(points) -> list[Anchor]:
    """H100 GEMMs ``(b, m, n, k, TFLOP/s)`` of XLA's table."""
    anchors = []
    for b, m, n, k, tflops in points:
        batch = "" if b == 1 else f"{b} x "
        anchors.append(Anchor(f"H100 GEMM {batch}{m}x{n}x{k}", "bf16 matmul b x (m x k) @ "
                              "(k x n), XLA's measured table", 2.0 * b * m * n * k,
                              tflops * 1e12, "FLOP/s", "XLA_SM90", (b, m, n, k)))
    return anchors


H100_GEMMS = _gemms([(1, 4096, 4096, 4096, 783.33), (1, 256, 2048, 256, 41.84),
                     (1, 2048, 2048, 2048, 631.98), (1, 1024, 2048, 2048, 524.29),
                     (1, 1024, 1024, 1024, 236.30), (4, 1024, 1024, 1024, 499.41),
                     (1, 4096, 4096, 1024, 677.44)])


def _attention(system: str, pass_: str, source: str, points) -> list[Anchor]:
    """FlashAttention-2 rates ``(head dim, tokens, causal, TFLOP/s)`` of one figure."""
    anchors = []
    for d, tokens, causal, tflops in points:
        length = f"{tokens // 1024}k" if tokens >= 1024 else str(tokens)
        mask = ", causal" if causal else ""
        anchors.append(Anchor(f"{system} FA2 {pass_} d{d} {'causal ' * causal}{length}",
                              f"FlashAttention-2 {pass_}, head dim {d}, {tokens} tokens{mask}",
                              tokens, tflops * 1e12, "FLOP/s", source, (pass_, d, tokens, causal)))
    return anchors


K16 = 16384           # the longest sequence the flash-attention figures measure
H100_FA2_FORWARD = _attention("H100", "forward", "FA3_PAPER", [
    (128, 512, False, 309), (128, K16, False, 370), (64, K16, False, 324), (256, K16, False, 326),
    (128, K16, True, 335), (128, 4096, False, 368), (64, 2048, True, 262),
    (128, 1024, True, 260), (256, 4096, True, 293)])
H100_FA2_BACKWARD = _attention("H100", "backward", "FA3_PAPER", [
    (128, 512, False, 214), (128, K16, False, 322), (64, K16, False, 291), (64, 2048, False, 264),
    (128, 4096, False, 310)])
A100_FA2 = _attention("A100", "fwd+bwd", "FA2_PAPER", [
    (128, K16, False, 203), (64, 2048, False, 162), (64, 1024, True, 119), (128, 4096, True, 173)])
H100_FA2 = _attention("H100", "fwd+bwd", "FA2_H100", [(128, 1024, False, 294),
                                                       (64, 2048, True, 232)])


# The anchors the emulation's constants are derived from (each curve's two ends; the
# device efficiencies from the best measured rates). Everything else is a check. The
# H100's GEMMs: the largest sets the efficiency, the smallest a matmul's fill. Attention:
# per pass, the longest sequence sets each head dimension's share and the shortest the fill;
# the causal one the mask's factor; the A100's forward + backward its share of the H100's.
FITTED = {a.key for a in (H200_ALLREDUCE[0], H200_ALLREDUCE[-1], A100_ALLREDUCE[0],
                          A100_ALLREDUCE[-1], H100_RING_1GB, NDR_NIC, A100_GEMM_PEAK,
                          A100_HBM, H200_HBM, *H100_GEMMS[:2], *H100_FA2_FORWARD[:5],
                          *H100_FA2_BACKWARD[:3], A100_FA2[0])}

ANCHORS = [*H200_ALLREDUCE, *A100_ALLREDUCE, H100_RING_1GB, NDR_NIC, A100_GEMM_PEAK,
           A100_GEMM_1024, *H100_GEMMS, A100_HBM, H200_HBM, *H100_FA2_FORWARD,
           *H100_FA2_BACKWARD, *A100_FA2, *H100_FA2, LLMC_STEP]
