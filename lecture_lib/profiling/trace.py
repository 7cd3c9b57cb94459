"""What one rank's ``torch.profiler`` trace says: where its steps went.

A slow distributed job is slow for one of a few reasons, and a profiler trace tells them
apart (PyTorch profiler recipe, "Profiling your PyTorch module"; HTA, "Holistic Trace
Analysis", Meta 2023; the Ultra-Scale Playbook's profiling chapter): communication takes a
large share of the step, or the device is idle much of it. A :class:`RankProfile` holds one
rank's events (:mod:`.events`: which are communication, which are work) and reduces them to
those shares: the length of the *union* of the intervals over the recorded steps, divided by
the recorded steps' length (:func:`shares`, :func:`overlap_share`). :func:`timeline` turns
a profile into spans for :func:`lecture_lib.figures.plots.plot_timeline`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .events import PHASE_PREFIX, Event, comm_intervals, comm_kinds, covered, merge


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
    launch_share: float | None = None         # emulated: the compute stream waiting for launches
    launch_gaps: list = field(default_factory=list)    # emulated: those waits, (start, end)

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


def exposed_share(profile: RankProfile) -> float:
    """Share of the recorded steps where the device waits for communication: a collective in
    flight while no kernel runs and none waits for its launch. A gap the host makes (an
    emulated trace's ``launch_gaps``; on a GPU, the CPU rows show the host still launching)
    is a wait for the host, not for the network, whatever is in flight meanwhile."""
    on_device = any(e.device for e in profile.events)
    occupied = merge([(e.start, e.end) for e in profile.events
                      if e.device == on_device and e.kind == "compute"] + list(profile.launch_gaps))
    windows = [(max(s, ws), min(e, we)) for s, e in occupied for ws, we in profile.steps
               if min(e, we) > max(s, ws)]
    span = sum(e - s for s, e in profile.steps)
    return profile.comm_share - covered(comm_intervals(profile.events), windows) / span
