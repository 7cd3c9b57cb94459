"""What a collective costs: the ideal ring (alpha-beta), and NCCL's algorithms and protocols.

Two models of one collective's seconds, for a buffer of ``n`` bytes on ``p`` ranks.

**The ideal ring** (``charges="roofline"``; Thakur, Rabenseifner & Gropp 2005;
Hockney 1994), one latency ``alpha`` per step and one bandwidth ``beta``:

    all-reduce               2 (p-1) alpha + 2 (p-1)/p * n / beta
    all-gather / reduce-scatter  (p-1) alpha +   (p-1)/p * n / beta   (n: the full buffer)
    all-to-all                 (p-1) alpha + (bytes this rank sends to others) / beta
    broadcast / reduce         (p-1) alpha + n / beta                 (pipelined ring)
    barrier                  2 (p-1) alpha
    send / recv                      alpha + n / beta

**NCCL** (``charges="calibrated"``). NCCL picks, for each call, the algorithm
and protocol its tuning model says is fastest (NVIDIA/nccl ``src/graph/tuning.cc``,
the model torch's ``torch/_inductor/comm_analysis.py`` mirrors): a time

    base latency + steps * latency per step + bus bytes / bus bandwidth

per (algorithm, protocol), the smallest wins. The bus bytes are the
``2 (p-1)/p n`` of an all-reduce (``(p-1)/p n`` for all-gather and
reduce-scatter), the quantity nccl-tests' "bus bandwidth" divides by, so a
bus bandwidth is comparable across sizes and rank counts. Modelled here:

* **LL** (low latency): 8-byte stores carrying their own flag, no handshake;
  base 6.6 us and 0.6 us per NVLink step (2.7 us per network step), at half the
  bus bandwidth, capped (tuning.cc's ``llMaxBw``): it wins for small messages,
  where an alpha-beta ring's ``2 (p-1) alpha`` is far too slow.
* **Simple** (large messages): base 8.4 us (tuning.cc), then a per-step latency
  and a bus bandwidth *measured* on a real node (a :class:`Fabric`). tuning.cc's
  own per-step latencies (3.4 us on NVLink) predict the 16 MB all-reduce of an
  A100 node 48% faster than nccl-tests measure it; the measured curve is what
  a student's run would see, so its two ends fix the two constants
  (:func:`fit_fabric`) and its middle points are the check (the course's
  calibration table).
* **NVLS** (NVLink SHARP: the NVSwitch reduces in the network) for the
  all-reduce of a node whose switch has it (H100/H200): one latency and one bus
  bandwidth, fitted the same way on the H200 node's curve.
* Across nodes: the ring's steps that cross the network pay the network's
  per-step latency and the whole ring runs at the network's bus bandwidth
  (one NIC per GPU).

Left out: LL128 (with tuning.cc's constants it would predict the A100 16 MB
all-reduce 20% faster than measured), the tree algorithm across nodes, the
number of channels by size, and contention between concurrent collectives.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

US = 1e-6
LL_BASE, SIMPLE_BASE = 6.6 * US, 8.4 * US          # tuning.cc, ring algorithm


# -- the ideal ring --------------------------------------------------------------------
def steps(kind: str, p: int) -> int:
    """Sequential ring steps of one collective on ``p`` ranks."""
    if kind in ("all_reduce", "barrier"):
        return 2 * (p - 1)
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"):
        return p - 1
    raise ValueError(f"unknown collective {kind!r}")


def bus_bytes(kind: str, nbytes: float, p: int) -> float:
    """Bytes each rank's link carries: what a bus bandwidth is measured against."""
    if kind == "all_reduce":
        return 2 * (p - 1) / p * nbytes
    if kind in ("all_gather", "reduce_scatter"):
        return (p - 1) / p * nbytes
    if kind == "barrier":
        return 0.0
    return float(nbytes)          # all-to-all: the bytes sent to others; broadcast, reduce


def collective_seconds(kind: str, nbytes: float, p: int, link) -> float:
    """Alpha-beta seconds of one ideal ring collective on a ``costmodel.Link``."""
    if p <= 1:
        return 0.0
    return steps(kind, p) * link.alpha + bus_bytes(kind, nbytes, p) / link.beta


def p2p_seconds(nbytes: float, link) -> float:
    """Alpha-beta seconds of one message."""
    return link.alpha + nbytes / link.beta


# -- NCCL ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fabric:
    """How NCCL performs on one kind of link: Simple-protocol ring constants (measured),
    LL constants (tuning.cc), and NVLS where the switch has it; seconds and bytes/s."""
    name: str
    busbw: float                  # ring, Simple, bytes/s
    step_latency: float           # ring, Simple, seconds per step
    ll_busbw: float               # LL's cap (tuning.cc llMaxBw), bytes/s
    ll_step_latency: float        # LL, seconds per step (tuning.cc hwLat)
    nvls_busbw: float = 0.0       # NVLS all-reduce (0: no NVLS)
    nvls_latency: float = 0.0
    source: str = ""

    def __post_init__(self):
        for key in ("busbw", "ll_busbw"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{self.name}: {key} must be > 0, not {getattr(self, key)!r}")
        for key in ("step_latency", "ll_step_latency", "nvls_busbw", "nvls_latency"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{self.name}: {key} must be >= 0, not {value!r}")


def fit_line(small: tuple[float, float], large: tuple[float, float], latency_steps: int,
             base: float) -> tuple[float, float]:
    """``(per-step latency, bus bandwidth)`` through two measured all-reduces of 8 ranks,
    each ``(bytes, bus bandwidth)``: ``t = base + steps * latency + bus_bytes / busbw``."""
    (n1, bw1), (n2, bw2) = small, large
    b1, b2 = bus_bytes("all_reduce", n1, 8), bus_bytes("all_reduce", n2, 8)
    t1, t2 = b1 / bw1, b2 / bw2
    busbw = (b2 - b1) / (t2 - t1)
    latency = (t1 - base - b1 / busbw) / latency_steps
    if latency < 0 or busbw <= 0:
        raise ValueError(f"no line through {small} and {large}")
    return latency, busbw


def _choices(kind: str, nbytes: float, p: int, intra: Fabric, inter: Fabric | None,
             nodes: int):
    """``(algorithm/protocol, seconds)`` of each way NCCL could run this call."""
    n_steps = steps(kind, p)
    net_steps = 0 if nodes <= 1 else (2 if kind in ("all_reduce", "barrier") else 1) * (nodes - 1)
    wide = inter if nodes > 1 else intra
    moved = bus_bytes(kind, nbytes, p)
    for proto, base, latency, bw in (
            ("ring/LL", LL_BASE, "ll_step_latency", min(wide.ll_busbw, wide.busbw / 2)),
            ("ring/Simple", SIMPLE_BASE, "step_latency", wide.busbw)):
        lat = (n_steps - net_steps) * getattr(intra, latency) + \
            net_steps * getattr(wide, latency)
        yield proto, base + lat + moved / bw
    if kind == "all_reduce" and nodes <= 1 and intra.nvls_busbw > 0:
        yield "NVLS/Simple", intra.nvls_latency + moved / intra.nvls_busbw


def nccl_choice(kind: str, nbytes: float, p: int, intra: Fabric, inter: Fabric | None = None,
                nodes: int = 1) -> tuple[str, float]:
    """NCCL's fastest ``(algorithm/protocol, seconds)`` for one collective."""
    if p <= 1:
        return "none", 0.0
    return min(_choices(kind, nbytes, p, intra, inter, nodes), key=lambda c: c[1])


def nccl_p2p_seconds(nbytes: float, fabric: Fabric) -> float:
    """One message: one ring step, LL or Simple, whichever is faster."""
    ll = LL_BASE + fabric.ll_step_latency + nbytes / min(fabric.ll_busbw, fabric.busbw / 2)
    simple = SIMPLE_BASE + fabric.step_latency + nbytes / fabric.busbw
    return min(ll, simple)
