"""Reading a ``torch.profiler`` trace: which events are communication, which are work.

A slow distributed job is slow for one of a few reasons, and a profiler trace
tells them apart (PyTorch profiler recipe, "Profiling your PyTorch module";
HTA, "Holistic Trace Analysis", Meta 2023; the Ultra-Scale Playbook's
profiling chapter): communication takes a large share of the step, or the
device is idle much of it. This module reduces a Chrome trace (one rank's) to
those shares.

Which events count as what:

* **communication**: on a GPU the NCCL kernels (``ncclDevKernel_AllReduce...``)
  on the device timeline; on the CPU (gloo) a collective from the moment the
  training thread hands it over (``c10d::allreduce_``) until gloo's thread has
  executed it (``gloo:all_reduce``, ``gloo:send``...), see :func:`comm_intervals`.
  :func:`comm_kinds` says which collectives a trace holds (all-reduce,
  send/recv, ...), which is what decides the advice of :mod:`.diagnose`.
* **busy** (useful work): on a GPU any other kernel or copy on the device; on
  the CPU any other operator (``cpu_op``). The rest of a step is waiting or
  idle: Python between operators, a pipeline bubble (which a trace shows as a
  stage waiting inside ``recv``), a slow peer.

Shares are the length of the *union* of those intervals over the recorded
steps, divided by the recorded steps' length, so nested and overlapping events
are counted once. :func:`timeline` turns a trace into spans for
:func:`lecture_lib.figures.plots.plot_timeline`.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple

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


@dataclass
class RankProfile:
    """What :func:`~.profiler.profile_steps` measured on one rank."""
    rank: int
    steps: list[tuple[float, float]]          # the recorded (active) steps, seconds
    events: list[Event]
    comm_share: float                         # from the trace
    busy_share: float                         # from the trace
    table: str                                # torch.profiler's key_averages table
    trace_path: str | None = None
    timer_totals: dict = field(default_factory=dict)   # metrics.Timer over the same steps
    timer_spans: list = field(default_factory=list)    # its (phase, start, end) spans

    @property
    def comm_kinds(self) -> set[str]:
        """The collectives this rank's recorded steps ran (see :func:`comm_kinds`)."""
        return comm_kinds(self.events)

    @property
    def step_seconds(self) -> float:
        """Mean length of a recorded step."""
        return sum(e - s for s, e in self.steps) / len(self.steps)

    @property
    def timer_comm_share(self) -> float | None:
        """Seconds in the timer's "comm" phase over the recorded steps' length (None if untimed).

        The trace's :attr:`comm_share` counts each collective from its hand-over to
        its end (for a blocking one, to the moment the training thread resumes);
        the timer counts the training thread's whole "comm" phase, which also holds
        whatever else the phase does (a flatten and a copy back, which the trace
        counts as computing), the Python around the call and any time the operating
        system preempted the thread inside the phase. So the timer never reads less;
        :meth:`step_comm_shares` says what the difference is made of.
        """
        if "comm" not in self.timer_totals:
            return None
        return self.timer_totals["comm"] / sum(e - s for s, e in self.steps)

    def step_comm_shares(self, phase: str = "comm") -> list[StepShares]:
        """Per recorded step, the trace's communication against the timer's ``phase``.

        The timer's spans are split evenly over the steps (the step must enter
        ``timer(phase)`` the same number of times in every step), else ``timed``
        is None. When :func:`~.profiler.profile_run` annotated the timer's phases
        into the trace (``phase:<name>`` ranges), the same phase is also read on
        the trace's clock and split into communication in flight, operators the
        trace counts as computing (a flatten, a copy back) and the rest (Python
        between operators, preemption by the operating system). Step by step, a
        preemption shows up in one step, not smeared over all.
        """
        comm = comm_intervals(self.events)
        on_device = any(e.device for e in self.events)
        work = [(e.start, e.end) for e in self.events
                if e.device == on_device and e.kind == "compute"]
        marked = [(e.start, e.end) for e in self.events if e.kind == "phase"
                  and e.name == PHASE_PREFIX + phase]
        spans = [e - s for name, s, e in self.timer_spans if name == phase]
        per = len(spans) // len(self.steps) if len(spans) % len(self.steps) == 0 else 0
        out = []
        for k, (s, e) in enumerate(self.steps):
            length = e - s
            timed = sum(spans[k * per:(k + 1) * per]) / length if per else None
            inside = merge((max(a, s), min(b, e)) for a, b in marked if min(b, e) > max(a, s))
            if inside:
                in_flight = covered(comm, inside)
                computing = covered(work + comm, inside) - in_flight
                out.append(StepShares(covered(comm, [(s, e)]) / length, timed,
                                      covered(inside, [(s, e)]) / length,
                                      in_flight / length, computing / length))
            else:
                out.append(StepShares(covered(comm, [(s, e)]) / length, timed))
        return out


class StepShares(NamedTuple):
    """One recorded step's communication, as shares of the step (see ``step_comm_shares``)."""
    comm: float                           # the trace's communication in flight
    timed: float | None                   # the timer's phase, on the library's clock
    phase: float | None = None            # the same phase on the trace's clock
    comm_in_phase: float | None = None    # communication in flight inside the phase
    compute_in_phase: float | None = None  # computing inside the phase, no communication

    @property
    def rest_in_phase(self) -> float | None:
        """The phase's time that is neither: Python between operators, preemption."""
        if self.phase is None:
            return None
        return self.phase - self.comm_in_phase - self.compute_in_phase


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


def shares(events: list[Event], steps) -> tuple[float, float]:
    """``(comm_share, busy_share)`` of the recorded steps, from the trace's events.

    ``busy_share`` counts computation only (communication in flight is not useful
    work, even where it keeps a GPU "utilised"). When the trace holds device (GPU)
    events, both are read on the device timeline (collective kernels against the
    other kernels); otherwise on the CPU events.
    """
    span = sum(e - s for s, e in steps)
    if span <= 0:
        raise ValueError("the recorded steps have no length")
    on_device = any(e.device for e in events)
    work = [(e.start, e.end) for e in events if e.device == on_device and e.kind == "compute"]
    return covered(comm_intervals(events), steps) / span, covered(work, steps) / span


def overlap_share(profile: RankProfile) -> float:
    """Share of the recorded steps where communication is in flight *while* the rank computes.

    DDP launches each bucket's all-reduce as soon as its gradients are ready, so
    communication overlaps the rest of the backward pass (Li et al. 2020); a sync
    after the backward overlaps nothing.
    """
    on_device = any(e.device for e in profile.events)
    compute = merge((e.start, e.end) for e in profile.events
                    if e.device == on_device and e.kind == "compute")
    windows = [(max(s, ws), min(e, we)) for s, e in compute for ws, we in profile.steps
               if min(e, we) > max(s, ws)]
    return covered(comm_intervals(profile.events), windows) / sum(e - s for s, e in profile.steps)


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


def timeline(profile: RankProfile, gap: float = 50e-6) -> list[tuple[str, float, float]]:
    """Spans ``(kind, start_s, end_s)`` of one rank's recorded steps, for ``plot_timeline``.

    Compute and communication are each merged (events less than ``gap`` apart
    become one span); communication is listed last so it is drawn on top where it
    overlaps compute (as DDP's all-reduce overlaps the backward pass).
    """
    on_device = any(e.device for e in profile.events)
    end = profile.steps[-1][1]
    compute = [(e.start, e.end) for e in profile.events
               if e.device == on_device and e.kind == "compute"]
    spans = []
    for kind, intervals in (("compute", compute), ("comm", comm_intervals(profile.events))):
        spans += [(kind, s, min(e, end)) for s, e in merge(intervals, gap) if s < end]
    return spans
