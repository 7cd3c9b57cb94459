"""What one GPU kernel costs: a matmul, an attention, anything else by its bytes.

Every operation the emulation charges is one kernel (:mod:`.compute` decides
which operations, and when the host launches them). Its time is a roofline
(Williams, Waterman & Patterson 2009), the longer of its FLOPs at the rate it
achieves and its bytes at the bandwidth it achieves, plus what real kernels add:

    seconds = kernel + fill + max(FLOPs / (peak * share * busy), bytes / bandwidth)

* ``kernel``: the least time any kernel occupies the GPU (:class:`~.devices.Device`).
* A matmul (cuBLAS's tiled GEMM): ``share`` is the best measured GEMM's share
  of the peak; ``busy`` the share of SMs its tiles keep busy (wave
  quantisation: the output is cut into 128 x 128 tiles, one per SM at a time,
  and the last wave leaves SMs idle; an output of fewer tiles than SMs is also
  split along the shared dimension, split-K, as cuBLAS does for a weight
  gradient); ``fill`` the time a GEMM spends beyond any kernel's least time
  before its first multiply and after its last (filling its pipeline of tiles
  from memory, storing the last ones). Both are fitted on measured GEMMs
  (:mod:`.devices`): an H100's is 84% of the peak and 2.6 us.

      A (m x k) @ B (k x n) = C (m x n), in tiles of 128 x 128:

      +----+----+----+    one tile per SM at a time: 132 SMs on an H100;
      | t1 | t2 | t3 |    9 tiles keep 9 of them busy, so cuBLAS also cuts
      +----+----+----+    each tile's sum over k into pieces (split-K)
      | t4 | .. | t9 |
      +----+----+----+

* Attention (:class:`FlashAttention`, the kernel PyTorch's SDPA runs on A100
  and H100 GPUs in bf16, FlashAttention-2): ``share`` depends on the head
  dimension, the sequence length and the causal mask, forward and backward
  apart, as Dao 2023 and Shah et al. 2024 measured it; no ``fill``.
* Any other operation (element-wise, norms, softmax, copies): its bytes alone.

``Charges`` holds one cluster's constants; under the roofline charges every
share is 1 and there is no kernel cost, fill or wave.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

TILE = 128                  # a matmul's output tile per SM (CUTLASS/cuBLAS's common 128 x 128)
BLOCK = 128                 # the queries (and keys) a flash-attention kernel takes at a time


class Charges:
    """The constants one cluster charges a kernel with (calibrated, or the roofline's)."""

    def __init__(self, cluster):
        d, cal = cluster.device, cluster.calibrated
        self.cluster = cluster
        self.bandwidth = d.memory_bandwidth * (d.memory_efficiency if cal else 1.0)
        self.efficiency = d.matmul_efficiency if cal else 1.0
        self.fill = d.matmul_fill_seconds if cal else 0.0
        self.flash = d.attention if cal else None
        self.sms = d.sms if cal else 0
        self.kernel = d.kernel_seconds if cal else 0.0
        self.launch = d.launch_seconds if cal and cluster.launch == "eager" else 0.0
        self.optimizer = cluster.optimizer if cal else "as-run"
        self.half = cluster.fp32 == "bf16"
        self._peaks: dict = {}

    def peak(self, dtype) -> float:
        """The FLOP rate an operation producing ``dtype`` is charged at, before any share."""
        rate = self._peaks.get(dtype)
        if rate is None:
            rate = self._peaks[dtype] = self.cluster.flops(dtype)
        return rate

    def matmul(self, flops: float, nbytes: float, tiles: int, dtype) -> float:
        """Seconds of a matmul kernel beyond ``kernel``: its fill, then its roofline."""
        compute = flops / (self.peak(dtype) * self.efficiency * busy_share(tiles, self.sms))
        return self.fill + max(compute, nbytes / self.bandwidth)

    def attention(self, flops: float, nbytes: float, shape, dtype) -> float:
        """Seconds of an attention kernel beyond ``kernel``: at its flash kernel's measured
        share of the peak for its shape (at the matmul's without one), or its bytes."""
        backward, head_dim, keys, causal, tiles = shape
        if self.flash is None:
            share = self.efficiency
        else:
            share = self.flash.share(backward, head_dim, keys, causal)
        compute = flops / (self.peak(dtype) * share * busy_share(tiles, self.sms))
        return max(compute, nbytes / self.bandwidth)


def attention_shape(func, args, kwargs) -> tuple[float, tuple]:
    """``(FLOPs, (backward, head dim, keys, causal, tiles))`` of one SDPA kernel, forward or
    backward, whichever backend: torch's SDPA formulas on the (batch, heads, tokens, head
    dim) shapes, halved when causal (a flash kernel skips the masked half); tiles are the
    blocks of 128 queries the kernel spreads over SMs."""
    names = [a.name for a in func._schema.arguments]
    a = dict(zip(names, args))
    a.update(kwargs)
    q, k, v = a["query"], a["key"], a["value"]
    grad = a.get("grad_out", a.get("grad_out_"))
    if grad is None:
        flops = sdpa_flop_count(q.shape, k.shape, v.shape)
    else:
        flops = sdpa_backward_flop_count(grad.shape, q.shape, k.shape, v.shape)
    causal = bool(a.get("is_causal"))
    if causal:
        flops /= 2
    tiles = math.prod(q.shape[:-2]) * -(-q.shape[-2] // BLOCK)
    return float(flops), (grad is not None, q.shape[-1], k.shape[-2], causal, tiles)


@dataclass(frozen=True)
class FlashAttention:
    """A flash-attention kernel's achieved rates, as shares of the device's peak (of the
    peak the operation's dtype is charged at: bf16's in a mixed-precision run).

    The kernel gives each block of 128 queries to one SM, which walks the keys in blocks of
    128. A query block also loads its queries and writes its output, which costs as much as
    ``fill`` key blocks, so with ``n = keys / 128`` key blocks it does useful work a share
    ``n / (n + fill)`` of its time. With a causal mask block ``i`` walks ``i`` key blocks,
    the last one half masked: ``n / (n + 1 + 2 fill)``, times ``causal``, what a causal
    kernel reaches of an unmasked one at long sequences (its blocks are of unequal length).
    ``forward`` and ``backward`` give, per head dimension, the share of the peak at long
    sequences without a mask; between head dimensions ``1 / share`` is linear in ``1 /
    head_dim`` (the softmax's work per score is fixed, the multiplies' grows with the head
    dimension), beyond the largest one it stays."""
    name: str
    forward: tuple                       # ((head dim, share of the peak), ...), increasing
    backward: tuple
    forward_fill: float
    backward_fill: float
    causal: float
    source: str = ""

    def share(self, backward: bool, head_dim: int, keys: int, causal: bool) -> float:
        """The share of the peak one kernel of this shape reaches."""
        table, fill = ((self.backward, self.backward_fill) if backward
                       else (self.forward, self.forward_fill))
        useful = busy(max(keys, 1), causal, fill) * (self.causal if causal else 1.0)
        return by_head_dim(table, head_dim) * useful


def by_head_dim(table, head_dim: int) -> float:
    """The share at ``head_dim``: ``1 / share`` linear in ``1 / head_dim`` between the
    table's points (and below the first, along the first two), constant past the last."""
    if head_dim >= table[-1][0] or len(table) == 1:
        return table[-1][1]
    i = 1                                   # the segment [i - 1, i] head_dim falls in
    while i < len(table) - 1 and head_dim >= table[i][0]:
        i += 1
    (d0, s0), (d1, s1) = table[i - 1], table[i]
    x = (1 / head_dim - 1 / d0) / (1 / d1 - 1 / d0)
    return 1 / (1 / s0 + x * (1 / s1 - 1 / s0))


def busy(keys: int, causal: bool, fill: float) -> float:
    """The useful share of a flash-attention kernel's time (:class:`FlashAttention`),
    before the causal factor."""
    n = keys / BLOCK
    return n / (n + 1 + 2 * fill) if causal else n / (n + fill)


def matmul_tiles(out, k: int, sms: int) -> int:
    """Work units of a matmul: its 128 x 128 output tiles (times its batch), each split
    along ``k`` (split-K, as cuBLAS does when there are fewer tiles than SMs) into at most
    ``ceil(sms / tiles)`` pieces of at least 256 of ``k``; the partial sums' reduction is
    not charged."""
    shape = out.shape
    tiles = math.prod(shape[:-2]) * -(-shape[-2] // TILE) * -(-shape[-1] // TILE)
    if 0 < tiles < sms:
        tiles *= max(1, min(-(-sms // tiles), k // (2 * TILE)))
    return tiles


def busy_share(tiles: int, sms: int) -> float:
    """The share of SM-time ``tiles`` work units keep busy, in waves of ``sms`` at a time."""
    if not sms or tiles <= 0:
        return 1.0
    return tiles / (-(-tiles // sms) * sms)


# Fitting the constants to measurements (:mod:`.devices` calls these with the anchors).

def gemm_seconds(device, b: int, m: int, n: int, k: int, efficiency: float,
                 fill: float) -> float:
    """Seconds of one bf16 GEMM ``b x (m x k) @ (k x n)`` on ``device`` at these constants
    (the charge of :meth:`Charges.matmul`, from shapes)."""
    flops = 2.0 * b * m * n * k
    tiles = matmul_tiles(torch.empty(b, m, n, device="meta"), k, device.sms)
    compute = flops / (device.bf16_flops * efficiency * busy_share(tiles, device.sms))
    memory = 2.0 * b * (m * k + k * n + m * n) / (device.memory_bandwidth
                                                   * device.memory_efficiency)
    return device.kernel_seconds + fill + max(compute, memory)


def fit_efficiency(device, gemm, fill: float) -> float:
    """The matmul efficiency at which a compute-bound GEMM ``((b, m, n, k), FLOP/s)`` takes
    its measured time, with ``fill``: its compute time is linear in ``1 / efficiency``."""
    fixed = device.kernel_seconds + fill
    at_peak = gemm_seconds(device, *gemm[0], 1.0, fill) - fixed
    return at_peak / (_flops(gemm) / gemm[1] - fixed)


def fit_gemm(device, big, small) -> tuple[float, float]:
    """``(matmul_efficiency, matmul_fill_seconds)`` through two measured GEMMs, each
    ``((b, m, n, k), FLOP/s)``: the large one sets the efficiency, the small one the fill
    (each solved for the other in turn, until they agree)."""
    efficiency, fill = 1.0, 0.0
    for _ in range(50):
        efficiency = fit_efficiency(device, big, fill)
        fill = _flops(small) / small[1] - gemm_seconds(device, *small[0], efficiency, 0.0)
    return efficiency, fill


def _flops(gemm) -> float:
    b, m, n, k = gemm[0]
    return 2.0 * b * m * n * k


def fit_flash_attention(name: str, rates: dict, peak: float, sms: int,
                        source: str) -> FlashAttention:
    """A :class:`FlashAttention` through measured rates ``{(pass, head dim, keys, causal):
    FLOP/s}`` of the benchmark's shapes (16k tokens, hidden size 2048): per pass, the fill
    through head dimension 128's shortest and longest unmasked sequences, each head
    dimension's share through its longest; the causal factor through the causal 128's
    longest forward. Shares are of ``peak``, at the benchmark's waves of query blocks."""
    longest = max(keys for _, _, keys, _ in rates)
    shortest = min(keys for _, _, keys, _ in rates)

    def waves(head_dim):        # 16k tokens x 2048 / head_dim heads, in blocks of 128 queries
        return busy_share(16384 * 2048 // (head_dim * BLOCK), sms)

    fits = {}
    for pass_ in ("forward", "backward"):
        fill = fit_fill((shortest, rates[pass_, 128, shortest, False]),
                        (longest, rates[pass_, 128, longest, False]))
        table = tuple((d, rate / (peak * waves(d) * busy(longest, False, fill)))
                      for (p, d, keys, causal), rate in sorted(rates.items())
                      if p == pass_ and keys == longest and not causal)
        fits[pass_] = fill, table
    fill, table = fits["forward"]
    causal = rates["forward", 128, longest, True] / (
        peak * waves(128) * by_head_dim(table, 128) * busy(longest, True, fill))
    return FlashAttention(name, fits["forward"][1], fits["backward"][1], fits["forward"][0],
                          fits["backward"][0], causal, source)


def fit_fill(short: tuple[int, float], long: tuple[int, float]) -> float:
    """The ``fill`` through two unmasked rates ``(keys, rate)`` at two lengths: their ratio
    is ``busy(short) / busy(long)``, solved for ``fill``."""
    (s1, r1), (s2, r2) = short, long
    n1, n2, ratio = s1 / BLOCK, s2 / BLOCK, r1 / r2
    return n1 * n2 * (1 - ratio) / (ratio * n2 - n1)


def forward_backward_share(kernel: FlashAttention, head_dim: int, keys: int,
                           causal: bool) -> float:
    """The share of the peak a forward and its backward reach together: torch counts the
    backward's FLOPs as 2.5 times the forward's."""
    return 3.5 / (1 / kernel.share(False, head_dim, keys, causal)
                  + 2.5 / kernel.share(True, head_dim, keys, causal))
