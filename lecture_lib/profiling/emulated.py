"""Profiling in emulated time: the same :class:`~.trace.RankProfile`, read from the emulation.

``torch.profiler`` records real time, which on a laptop shows how a few shared
CPU cores run the ranks. Under :mod:`lecture_lib.emulate` each rank keeps a
virtual compute stream and communication stream, and its clock records every
span of both (what a GPU trace's kernel rows show: compute kernels on one
stream, collectives on another). :func:`profile_steps_emulated` runs the step
under the emulation and turns those spans into the events of a
:class:`~.trace.RankProfile`, as device events (a wait of the compute stream for a
kernel's launch is a gap between kernels, as on a GPU), so :func:`~.trace.shares`,
:func:`~.trace.overlap_share`, :func:`~.trace.timeline` and
:func:`~.diagnose.diagnose_run` read it exactly as they read a GPU trace.
Its ``table`` is the emulated seconds by kind of span.
"""
from __future__ import annotations

import bisect

import torch.distributed as dist

from ..emulate import emulated
from ..metrics import Timer
from .events import Event
from .trace import RankProfile, shares

_STREAMS = {"comm": "emulated communication stream"}


def profile_steps_emulated(step, preset="h100-node", *, wait: int = 1, warmup: int = 1,
                           active: int = 3, timer: Timer | None = None) -> RankProfile:
    """Run ``step(i)`` for ``wait + warmup + active`` steps under ``emulate.emulated(preset)``
    and profile the last ``active`` in emulated time (inside a rank function)."""
    if not callable(step):
        raise TypeError(f"step must be callable, not {type(step).__name__}")
    rank = dist.get_rank() if dist.is_initialized() else 0
    with emulated(preset) as clock:
        for i in range(wait + warmup):
            step(i)
        clock.synchronize()
        if timer is not None:
            timer.reset()
        steps = []
        for i in range(wait + warmup, wait + warmup + active):
            start = clock.synchronize()
            step(i)
            steps.append((start, clock.synchronize()))
    origin, end = steps[0][0], steps[-1][1]
    # the clock extends a span that goes on across the first step's start: clip, not skip
    spans = [(kind, max(s, origin), min(e, end), text) for kind, s, e, text in clock.spans
             if e > origin and s < end]
    waits = [(a, b) for a, b in clock.launch_waits if b > origin and a < end]
    events = [Event(text or kind, "comm" if kind == "comm" else "compute", a - origin,
                    b - origin, _STREAMS.get(kind, "emulated compute stream"), device=True)
              for kind, s, e, text in spans if kind != "idle"
              for a, b in ([(s, e)] if kind == "comm" else kernels_only(s, e, waits))]
    steps = [(s - origin, e - origin) for s, e in steps]
    comm, busy = shares(events, steps)
    launch_share = sum(min(b, end) - max(a, origin) for a, b in waits) / (end - origin)
    return RankProfile(rank, steps, events, comm, busy, _table(spans, steps, waits), None,
                       dict(timer.totals) if timer is not None else {},
                       list(timer.spans) if timer is not None else [], launch_share,
                       [(max(a, origin) - origin, min(b, end) - origin) for a, b in waits])


def kernels_only(start: float, end: float, waits: list) -> list[tuple[float, float]]:
    """The parts of a compute span ``start..end`` in which a kernel runs: the stream's waits
    for the host (``waits``: sorted, disjoint ``(start, end)``) cut out, as a GPU trace
    shows them (gaps between kernels)."""
    out, at = [], start
    for a, b in waits[bisect.bisect_right([w[1] for w in waits], start):]:
        if a >= end:
            break
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < end:
        out.append((at, end))
    return out


def _table(spans, steps, waits) -> str:
    """Emulated seconds per kind of span over the profiled steps (what a profiler's table
    would sum), with its share of the steps' length; communication per collective; the
    compute stream's waits for kernel launches (inside the compute spans) on a row of their own."""
    total = sum(e - s for s, e in steps)
    by_kind: dict[str, float] = {}
    for kind, s, e, text in spans:
        name = f"comm: {text}" if kind == "comm" and text else kind
        by_kind[name] = by_kind.get(name, 0.0) + (e - s)
    by_kind["(of those) waiting for launches"] = sum(b - a for a, b in waits)
    rows = [f"{'emulated span':<28}{'seconds':>12}{'% of steps':>12}"]
    for name, seconds in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        rows.append(f"{name:<28}{seconds:>12.3e}{100 * seconds / total:>11.1f}%")
    return "\n".join(rows)
