"""Communication cost: the alpha-beta model, ring collectives, and real links.

Sending ``n`` bytes over one link costs ``alpha + n / beta``: a fixed latency
``alpha`` (seconds) and a bandwidth ``beta`` (bytes/s) (Hockney 1994). A ring
collective over ``p`` ranks runs ``p - 1`` (reduce-scatter, all-gather,
all-to-all) or ``2 (p - 1)`` (all-reduce) steps, each moving ``1/p`` of the
buffer, so (Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective
Communication Operations in MPICH"; the same factors define NCCL's "bus
bandwidth", nccl-tests doc/PERFORMANCE.md):

    all-reduce       2 (p-1) alpha + 2 (p-1)/p * n / beta
    reduce-scatter     (p-1) alpha +   (p-1)/p * n / beta
    all-gather         (p-1) alpha +   (p-1)/p * n / beta
    all-to-all         (p-1) alpha +   (p-1)/p * n / beta

``n`` is the size of the whole buffer (all-reduce input; reduce-scatter input;
all-gather output). :func:`bus_factor` is the bandwidth factor alone:
bus bandwidth = algorithm bandwidth x bus_factor.

:func:`naive_all_reduce_time` is the root-based all-reduce against which the ring is
measured (notebook 01): two rounds, ``2 alpha + 2 (p-1) n / beta``, all of its bytes on
the root's link.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_STEPS = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "all_to_all": 1}


@dataclass(frozen=True)
class Link:
    """One tier of interconnect: latency ``alpha`` in s, bandwidth ``beta`` in bytes/s."""
    name: str
    alpha: float
    beta: float
    source: str = ""


# Per-GPU figures. NVLink 4 on H100 SXM: 900 GB/s bidirectional per GPU, i.e. 450 GB/s
# each way (NVIDIA H100 datasheet); NCCL all-reduce on 8 x H100 measures a bus bandwidth of
# roughly 270-360 GB/s in practice, so we take 300 GB/s. InfiniBand NDR: 400 Gb/s = 50 GB/s per
# NIC, one NIC per GPU in a DGX H100 (NVIDIA DGX H100 user guide); ~45 GB/s achieved.
NVLINK_H100 = Link("NVLink (H100, in a node)", alpha=3e-6, beta=300e9,
                   source="a round figure for what NCCL's ring all-reduce reaches on 8 H100s "
                          "(nccl-tests: 270-370 GB/s bus bandwidth) of NVLink's 450 GB/s each "
                          "way (NVIDIA H100 datasheet: 900 GB/s bidirectional)")
INFINIBAND_NDR = Link("InfiniBand NDR (across nodes)", alpha=10e-6, beta=45e9,
                      source="NVIDIA ConnectX-7 / DGX H100: 400 Gb/s per GPU")
# The A100 generation the Megatron-LM paper trained GPT-3 175B on (Narayanan et al. 2021, section
# 5: DGX A100 nodes, NVLink 3 at 600 GB/s bidirectional per GPU, 8 x 200 Gb/s HDR InfiniBand).
NVLINK_A100 = Link("NVLink (A100, in a node)", alpha=3e-6, beta=200e9,
                   source="NVIDIA A100 datasheet (600 GB/s NVLink per GPU, bidirectional)")
INFINIBAND_HDR = Link("InfiniBand HDR (across nodes)", alpha=10e-6, beta=22e9,
                      source="DGX A100: 8 x 200 Gb/s HDR per node, 25 GB/s per GPU")


def bus_factor(kind: str, world_size: int) -> float:
    """Bus bandwidth / algorithm bandwidth for a ring collective (nccl-tests' definition).

    A point-to-point ``"send"`` moves its whole buffer: factor 1 (so a recorder's
    ``sent_bytes`` counts ring attention's and a pipeline's sends as they are).
    """
    if kind == "send":
        return 1.0
    if kind not in _STEPS:
        raise ValueError(f"unknown collective {kind!r}; known: {sorted(_STEPS)}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, not {world_size}")
    return _STEPS[kind] * (world_size - 1) / world_size


def collective_time(kind: str, nbytes: float, world_size: int, link: Link) -> float:
    """Seconds for a ring collective on ``nbytes`` over ``world_size`` ranks on ``link``."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, not {nbytes}")
    if world_size == 1:
        return 0.0
    steps = _STEPS.get(kind, 0) * (world_size - 1)
    return steps * link.alpha + bus_factor(kind, world_size) * nbytes / link.beta


def naive_all_reduce_time(nbytes: float, world_size: int, link: Link) -> float:
    """Seconds for the naive all-reduce on ``link``: every rank sends its whole buffer to the
    root, the root sends the sum back. Two rounds (the ``p - 1`` messages of a round are in
    flight at once: their latencies overlap), and the root's one link carries ``2 (p - 1)``
    whole buffers: ``2 alpha + 2 (p - 1) n / beta``."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, not {nbytes}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, not {world_size}")
    if world_size == 1:
        return 0.0
    return 2 * link.alpha + 2 * (world_size - 1) * nbytes / link.beta


def fit_alpha_beta(nbytes, seconds) -> tuple[float, float]:
    """Least-squares fit of ``seconds = alpha + nbytes / beta``; returns ``(alpha, beta)``.

    Each point is weighted by 1/seconds, so small and large messages count
    alike (a plain fit would let the largest message decide everything).
    """
    x, y = np.asarray(nbytes, float), np.asarray(seconds, float)
    if len(x) < 2 or len(x) != len(y):
        raise ValueError("need at least two (nbytes, seconds) points of equal length")
    w = 1.0 / y
    a = np.stack([np.ones_like(x), x], 1) * w[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, y * w, rcond=None)
    if inv_beta <= 0:
        raise ValueError("fitted bandwidth is not positive: time does not grow with size")
    return float(max(alpha, 0.0)), float(1.0 / inv_beta)
