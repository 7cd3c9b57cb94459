"""The collectives notebook's self-study answers, from the ring cost model (costmodel.comm)."""
from __future__ import annotations

from ..costmodel import NVLINK_H100, Link, bus_factor, collective_time
from ..costmodel.comm import naive_all_reduce_time
from . import fmt

GRADIENT_BYTES = 4e9         # 1e9 fp32 gradients


def q1_ring_time() -> list[str]:
    """Ring all-reduce of 1e9 fp32 gradients on 8 GPUs over NVLink (H100 preset): total time,
    and the latency term alone."""
    p, link = 8, NVLINK_H100
    total = collective_time("all_reduce", GRADIENT_BYTES, p, link)
    latency = 2 * (p - 1) * link.alpha
    return [fmt(total * 1e3, "ms"), fmt(latency * 1e6, "us")]


def q2_bytes_per_rank() -> list[str]:
    """Bytes one rank sends: all-reduce against reduce-scatter, then all-gather (p = 8, 4 GB)."""
    p = 8
    all_reduce = bus_factor("all_reduce", p) * GRADIENT_BYTES
    half = bus_factor("reduce_scatter", p) * GRADIENT_BYTES
    assert abs(half + bus_factor("all_gather", p) * GRADIENT_BYTES - all_reduce) < 1
    return [fmt(all_reduce / 1e9, "GB"), fmt(half / 1e9, "GB")]


def q3_latency_ratio() -> list[str]:
    """The latency term at p = 8 against p = 2 (alpha only: an infinitely fast link)."""
    only_alpha = Link("latency only", alpha=1.0, beta=float("inf"))
    ratio = (collective_time("all_reduce", 1.0, 8, only_alpha)
             / collective_time("all_reduce", 1.0, 2, only_alpha))
    return [f"{ratio:.0f} times"]


def q4_algbw_busbw() -> list[str]:
    """A 64 MiB all-reduce on 4 ranks that takes 0.25 s: algorithm and bus bandwidth."""
    nbytes, seconds, p = 64 * 2 ** 20, 0.25, 4
    algbw = nbytes / seconds
    return [fmt(algbw / 1e6, "MB/s"), fmt(algbw * bus_factor("all_reduce", p) / 1e6, "MB/s")]


def q5_naive_vs_ring() -> list[str]:
    """Naive against ring all-reduce of 1e9 fp32 gradients on 8 GPUs over NVLink (H100
    preset), where every GPU has its own link: both times and their ratio."""
    p, link = 8, NVLINK_H100
    naive = naive_all_reduce_time(GRADIENT_BYTES, p, link)
    ring = collective_time("all_reduce", GRADIENT_BYTES, p, link)
    return [fmt(naive * 1e3, "ms"), fmt(ring * 1e3, "ms"), f"{naive / ring:.0f} times"]


ANSWERS = {"Q1": q1_ring_time, "Q2": q2_bytes_per_rank, "Q3": q3_latency_ratio,
           "Q4": q4_algbw_busbw, "Q5": q5_naive_vs_ring}
