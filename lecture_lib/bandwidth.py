"""The bandwidth benchmark: torch's collectives and the course's, timed side by side.

The method and definitions are nccl-tests' (NVIDIA, "Performance reported by
NCCL tests", doc/PERFORMANCE.md): warm-up calls, a barrier before each timed
call, the median of repeats, and a call's time is the slowest rank's.
*Algorithm bandwidth* is bytes / seconds; *bus bandwidth* multiplies it by
the collective's bus factor (:func:`lecture_lib.costmodel.bus_factor`), so
that every collective is compared with the link's peak. :func:`fit_sweep`
fits the alpha-beta model (``seconds = alpha + bytes / beta``) to the times.
:func:`measure_bandwidth` runs the sweep from the caller, one call of the
ranks per point, so that a notebook shows its progress.
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from .collectives import naive_all_reduce, ring_all_gather, ring_all_reduce, ring_reduce_scatter
from .comm import all_gather_single, reduce_scatter_single
from .costmodel import bus_factor, fit_alpha_beta
from .metrics import wall_time
from .progress import progress
from .runtime import device, run

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
IMPLS = ("torch", "ring", "naive")


def _one_call(kind: str, impl: str, size: int, group):
    """A closure that runs one collective on a float32 buffer of ``size`` bytes (whole buffer)."""
    p, dev = dist.get_world_size(group), device()
    n = max(size // 4 // p * p, p)
    buf = torch.ones(n, device=dev)
    part = torch.empty(n // p, device=dev)
    full = torch.empty(n, device=dev)
    if kind == "all_reduce":
        return {"torch": lambda: dist.all_reduce(buf, group=group),
                "ring": lambda: ring_all_reduce(buf, group=group),
                "naive": lambda: naive_all_reduce(buf, group=group)}[impl], n * 4
    if kind == "reduce_scatter":
        return {"torch": lambda: reduce_scatter_single(part, buf, group=group),
                "ring": lambda: ring_reduce_scatter(buf, group=group)}[impl], n * 4
    return {"torch": lambda: all_gather_single(full, part, group=group),
            "ring": lambda: ring_all_gather(part, group=group)}[impl], n * 4


def bandwidth_sweep(sizes, kinds=KINDS, impls=("torch", "ring"), warmup: int = 1,
                    repeats: int = 3, group=None) -> list[dict]:
    """Time each collective, implementation and message size; call on every rank.

    ``sizes`` in bytes (the whole buffer, rounded down to whole float32 elements per
    rank). Per point: ``warmup`` untimed calls, then ``repeats`` timed calls each
    preceded by a barrier; a call's time is the slowest rank's, the point's time the
    median. Returns rows ``{kind, impl, bytes, seconds, algbw, busbw, world_size}``
    (bandwidths in bytes/s; busbw = algbw x :func:`~lecture_lib.costmodel.bus_factor`).
    """
    _check_sweep(kinds, impls, warmup, repeats)
    if dist.get_rank(group) < 0:
        raise ValueError("this rank is not a member of the group")
    p, dev = dist.get_world_size(group), device()
    rows = []
    for kind in kinds:
        for size in sizes:
            for impl in impls:
                call, nbytes = _one_call(kind, impl, int(size), group)
                for _ in range(warmup):
                    call()
                times = []
                for _ in range(repeats):
                    dist.barrier(group)
                    with wall_time(dev) as t:
                        call()
                    slowest = torch.tensor([t.seconds], dtype=torch.float64, device=dev)
                    dist.all_reduce(slowest, dist.ReduceOp.MAX, group=group)
                    times.append(slowest.item())
                seconds = statistics.median(times)
                algbw = nbytes / seconds
                rows.append({"kind": kind, "impl": impl, "bytes": nbytes, "seconds": seconds,
                             "algbw": algbw, "busbw": algbw * bus_factor(kind, p),
                             "world_size": p})
    return rows


def _check_sweep(kinds, impls, warmup: int, repeats: int) -> None:
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    for impl in impls:
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, not {impl!r}")
        if impl == "naive" and set(kinds) != {"all_reduce"}:
            raise ValueError("the naive implementation exists for all_reduce only")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, not {warmup}, {repeats}")


def measure_bandwidth(world_size: int, sizes, kinds=KINDS, impls=("torch", "ring"),
                      warmup: int = 1, repeats: int = 3, *, backend: str = "auto",
                      timeout: float = 300.0) -> list[dict]:
    """:func:`bandwidth_sweep` on ``world_size`` ranks, called from the notebook or script.

    The arguments are checked first; then each point (kind, size) is one warm call of
    the ranks, which times every implementation at that size in turn, as the sweep
    does, with :func:`~lecture_lib.progress.progress`. ``timeout`` is each call's.
    Returns rank 0's rows, in :func:`bandwidth_sweep`'s order.
    """
    _check_sweep(kinds, impls, warmup, repeats)
    points = [(kind, int(size)) for kind in kinds for size in sizes]
    rows = []
    for kind, size in progress(points, f"bandwidth: {world_size} ranks, one (collective, "
                               "size) each"):
        rows += run(bandwidth_sweep, world_size, [size], (kind,), tuple(impls), warmup,
                    repeats, backend=backend, timeout=timeout)[0]
    return rows


def fit_sweep(rows: list[dict]) -> dict[tuple[str, str, int], tuple[float, float]]:
    """Fit ``seconds = alpha + bytes / beta`` per (kind, impl, world_size);
    values ``(alpha, beta)``."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["kind"], row["impl"], row["world_size"]), []).append(row)
    return {key: fit_alpha_beta([r["bytes"] for r in pts], [r["seconds"] for r in pts])
            for key, pts in groups.items()}
