"""Reading a ``torch.profiler`` trace into events: which are communication, which are work.

* **communication**: on a GPU the NCCL kernels (``ncclDevKernel_AllReduce...``) on the device
  timeline; on the CPU (gloo) a collective from the moment the training thread hands it over
  (``c10d::allreduce_``) until gloo's thread has executed it (``gloo:all_reduce``,
  ``gloo:send``...), see :func:`comm_intervals`. :func:`comm_kinds` says which collectives a
  trace holds (all-reduce, send/recv, ...), which is what decides the advice of
  :mod:`.diagnose`.
* **busy** (useful work): on a GPU any other kernel or copy on the device; on the CPU any
  other operator (``cpu_op``). The rest of a step is waiting or idle: Python between
  operators, a pipeline bubble (which a trace shows as a stage waiting inside ``recv``), a
  slow peer.

:func:`merge` and :func:`covered` are the interval arithmetic the shares of :mod:`.trace`
are made of: nested and overlapping events count once.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

# Names of communication events: NCCL kernels, gloo's executions, c10d calls.
COMM_PATTERN = re.compile(
    r"nccl|gloo:|c10d::|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|"
    r"\bsend\b|\brecv\b|barrier", re.IGNORECASE)

# A metrics.Timer phase annotated into the trace (torch.profiler.record_function).
PHASE_PREFIX = "phase:"

# After a blocking collective ends, the training thread's next operator within this many
# seconds counts as the moment it resumed (the wait and the wake-up are not trace events).
_RESUME_SLACK = 0.05


@dataclass
class Event:
    """One complete event of a trace; times in seconds from the first recorded step."""
    name: str
    kind: str          # "comm", "compute" or "step"
    start: float
    end: float
    thread: str
    device: bool = False    # a GPU kernel or copy (device timeline) rather than a CPU event


# ----------------------------------------------------------------------------
# Reading a trace
# ----------------------------------------------------------------------------

def classify(name: str, category: str | None = None) -> str | None:
    """'step', 'phase', 'comm', 'compute' or None (neither work nor a step).

    A 'phase' is a timer phase annotated into the trace (``phase:<name>``).
    """
    if name.startswith("ProfilerStep#"):
        return "step"
    if name.startswith(PHASE_PREFIX):
        return "phase"
    if COMM_PATTERN.search(name):
        return "comm"
    if category in ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset"):
        return "compute"
    return None


def read_trace(trace) -> tuple[list[Event], list[tuple[float, float]]]:
    """Events and recorded steps of a Chrome trace (a path or the parsed JSON).

    Times become seconds from the start of the first recorded step. Works on any
    trace ``torch.profiler`` exports, on CPU or GPU.
    """
    if isinstance(trace, (str, os.PathLike)):
        with open(trace) as f:
            trace = json.load(f)
    raw = trace["traceEvents"] if isinstance(trace, dict) else trace
    picked = []
    for e in raw:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        kind = classify(e["name"], e.get("cat"))
        if kind is not None:
            device = e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            picked.append((e["name"], kind, float(e["ts"]), float(e["ts"]) + float(e["dur"]),
                           str(e.get("tid")), device))
    steps = sorted((s, t) for _, kind, s, t, _, _ in picked if kind == "step")
    if not steps:
        raise ValueError("the trace holds no ProfilerStep# events: profile with a schedule "
                         "and call prof.step() after every training step")
    t0 = steps[0][0]
    events = [Event(n, k, (s - t0) * 1e-6, (t - t0) * 1e-6, th, d)
              for n, k, s, t, th, d in picked if k != "step"]
    return events, [((s - t0) * 1e-6, (t - t0) * 1e-6) for s, t in steps]


def merge(intervals, gap: float = 0.0) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals, joining those less than ``gap`` apart."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def covered(intervals, windows) -> float:
    """Seconds of ``windows`` covered by the union of ``intervals``."""
    union, total = merge(intervals), 0.0
    for ws, we in windows:
        for s, e in union:
            total += max(0.0, min(e, we) - max(s, ws))
    return total


def comm_intervals(events: list[Event]) -> list[tuple[float, float]]:
    """When communication is in flight, as ``(start, end)`` intervals.

    On a GPU: the collective kernels. On the CPU, gloo runs a collective on its
    own thread (``gloo:all_reduce``) after the training thread hands it over
    (``c10d::allreduce_``); the collective is in flight from the hand-over to the
    end of gloo's execution, so the i-th ``c10d::`` call is joined to the i-th
    ``gloo:`` execution (they run in the order issued). When the counts differ
    (a trace cut mid-collective), each event counts on its own.
    """
    if any(e.device for e in events):
        return [(e.start, e.end) for e in events if e.device and e.kind == "comm"]
    def op(name):                # "c10d::allreduce_" and "gloo:all_reduce" -> "allreduce"
        return name.split(":")[-1].strip("_").replace("_", "")

    handovers = [e for e in events if e.name.startswith("c10d::")]
    runs = [e for e in events if e.name.startswith("gloo:")]
    out = [(e.start, e.end) for e in events if e.kind == "comm"
           and not e.name.startswith(("c10d::", "gloo:"))]
    # A blocking collective holds the training thread until it resumes: its next
    # operator starts no earlier than the collective's end (the wait itself is not
    # an event). An asynchronous one (DDP's, an isend) lets the thread go on at once.
    threads = {e.thread for e in handovers}
    starts = sorted(e.start for e in events if e.thread in threads and e.kind == "compute")
    for kind in {op(e.name) for e in handovers + runs}:
        calls = sorted((e.start, e.end) for e in handovers if op(e.name) == kind)
        done = sorted((e.start, e.end) for e in runs if op(e.name) == kind)
        if len(calls) != len(done):
            out += calls + done
            continue
        for (c0, c1), (_, r1) in zip(calls, done):
            resume = next((t for t in starts if t >= c1), r1)
            out.append((c0, max(c1, r1, resume if resume <= r1 + _RESUME_SLACK else r1)))
    return out


# The collectives a communication event's name can name, as :func:`comm_kinds` reports them.
_KIND_PATTERNS = [("all_reduce", r"all_?reduce"), ("all_gather", r"all_?gather"),
                  ("reduce_scatter", r"reduce_?scatter"), ("all_to_all", r"all_?to_?all"),
                  ("broadcast", r"broadcast"), ("send", r"send"), ("recv", r"recv"),
                  ("barrier", r"barrier")]


def comm_kinds(events: list[Event]) -> set[str]:
    """Which collectives the trace's communication events are: ``{"all_reduce", ...}``."""
    names = {e.name for e in events if e.kind == "comm"}
    return {kind for kind, pattern in _KIND_PATTERNS
            if any(re.search(pattern, n, re.IGNORECASE) for n in names)}
