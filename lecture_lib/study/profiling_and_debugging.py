"""The profiling notebook's hand calculations: shares of a step and the rules of thumb (the
communication rule reads the *exposed* share), the GPipe bound on a stage's busy share, what summed
gradients do to SGD, and a step's buckets on the communication stream (in flight against exposed:
smaller messages take longer in all, yet the step is shorter; and what if the link is slower)."""
from __future__ import annotations

from .. import observe, profiling
from ..costmodel import pipeline_bubble
from ..metrics import now
from ..profiling import diagnose
from . import fmt

COMPUTE_MS, ALLREDUCE_MS, HIDDEN_MS = 120.0, 60.0, 40.0
STAGES, MICRO = 4, 4
RANKS, LR = 8, 0.01
FORWARD_MS, BACKWARD_MS, BUCKETS = 40.0, 80.0, 4
FLAT_MS, BUCKET_MS, SLOW_BUCKET_MS = 60.0, 20.0, 25.0   # 4 x 20 ms > 60 ms: small messages


def q1() -> list[str]:
    """Compute 120 ms, an all-reduce of 60 ms of which 40 ms hide behind backward: step, share
    in flight, busy share, exposed share. Neither rule fires on the exposed share; a rule read on
    the share in flight would."""
    step = COMPUTE_MS + ALLREDUCE_MS - HIDDEN_MS
    exposed, in_flight = (ALLREDUCE_MS - HIDDEN_MS) / step, ALLREDUCE_MS / step
    d = diagnose(exposed, COMPUTE_MS / step, comm_kinds={"all_reduce"})
    assert not d.comm_bound and not d.underused
    assert diagnose(in_flight, COMPUTE_MS / step, comm_kinds={"all_reduce"}).comm_bound
    return [fmt(step, "ms"), fmt(100 * in_flight, "%"), fmt(100 * d.busy_share, "%"),
            fmt(100 * exposed, "%")]


def q2() -> list[str]:
    """GPipe on 4 stages with 4 micro-batches: the most a stage can be busy."""
    busy = 1 - pipeline_bubble(STAGES, MICRO)
    d = diagnose(0.0, busy, comm_kinds={"send", "recv"})
    assert d.underused
    return [fmt(100 * busy, "%")]


def q3() -> list[str]:
    """Gradients summed over 8 ranks with SGD at lr 0.01: the learning rate in effect."""
    return [f"{RANKS * LR:g}"]


def bucketed_step(forward: float, backward: float, buckets: int,
                  per_bucket: float) -> tuple[float, float, float]:
    """``(step, communication in flight, exposed)``: bucket i is ready after (i + 1) / buckets of
    the backward and all-reduced in ``per_bucket``, one at a time on the communication stream
    (each starts when it is ready and the one before is done)."""
    free = 0.0
    for i in range(buckets):
        free = max(free, forward + backward * (i + 1) / buckets) + per_bucket
    step = max(forward + backward, free)
    return step, buckets * per_bucket, step - forward - backward


def q5() -> list[str]:
    """Flat (60 ms after backward) against 4 buckets of 20 ms (longer in all: each smaller
    message pays the fixed latency and reaches less bandwidth); then buckets of 25 ms."""
    compute = FORWARD_MS + BACKWARD_MS
    flat = compute + FLAT_MS
    step, flight, exposed = bucketed_step(FORWARD_MS, BACKWARD_MS, BUCKETS, BUCKET_MS)
    assert flight > FLAT_MS and step < flat and flight / step > FLAT_MS / flat
    assert exposed == BUCKET_MS                                # only the last bucket is exposed
    rule = [diagnose(e / total, compute / total, comm_kinds={"all_reduce"}).comm_bound
            for e, total in ((FLAT_MS, flat), (exposed, step))]
    assert rule == [True, False]                               # on the exposed share: flat only
    for comm, total in ((FLAT_MS, flat), (flight, step)):     # on the share in flight: both
        assert diagnose(comm / total, compute / total, comm_kinds={"all_reduce"}).comm_bound
    slow, _, slow_exposed = bucketed_step(FORWARD_MS, BACKWARD_MS, BUCKETS, SLOW_BUCKET_MS)
    assert slow_exposed > SLOW_BUCKET_MS                       # more than the last bucket
    return [fmt(flat, "ms"), fmt(100 * FLAT_MS / flat, "%"), fmt(step, "ms"),
            fmt(100 * flight / step, "%"), fmt(100 * exposed / step, "%"), fmt(flight, "ms"),
            fmt(FLAT_MS, "ms"), fmt(slow, "ms"), fmt(slow_exposed, "ms")]


ANSWERS = {"Q1": q1, "Q2": q2, "Q3": q3, "Q5": q5}


def pipeline_step_marked(timer, **kwargs):
    """:func:`~lecture_lib.profiling.pipeline_step`, with each forward and backward of each
    micro-batch added to ``timer``'s spans as ``("F0", start, end)``, ``("B1", ...)``: the
    executor marks every action (:func:`lecture_lib.observe.span`); this only listens."""
    step = profiling.pipeline_step(timer, **kwargs)

    def marked(i):
        with observe.watch() as watcher:
            step(i)
        t0 = timer.now() - now(stream_only=True)           # the timer's zero on this clock
        timer.spans += [(str(s.data["action"]), s.start + t0, s.end + t0)
                        for s in watcher.spans if s.name in ("F", "B")]
    return marked


def gpipe_blocks(pipe):
    """Section 2's two-stage pipeline (profiled with :func:`pipeline_step_marked`) as timeline
    blocks: each forward and backward of each micro-batch in each stage's last recorded step,
    in seconds from rank 0's step start. Each rank's clock starts at its own step, so stage 1
    is shifted until its first receive ends when stage 0's first send does. Returns
    ({stage: [(kind, start, end, label)]}, step length, shift of stage 1 in seconds)."""
    first = lambda p, word: next(e.end for e in p.events if e.name.startswith(word))  # noqa: E731
    shift = first(pipe[1], "recv") - first(pipe[0], "send")
    origin = pipe[0].steps[-1][0]
    out = {}
    for p, dt in ((pipe[0], 0.0), (pipe[1], shift)):
        start, end = p.steps[-1]
        out[f"stage {p.rank}"] = [(name[0], a - dt - origin, b - dt - origin, name)
                                  for name, a, b in p.timer_spans if start <= a and b <= end]
    for blocks in out.values():
        assert sorted(label for *_, label in blocks) == ["B0", "B1", "F0", "F1"], blocks
    return out, pipe[0].steps[-1][1] - origin, shift


def diagnose_row(r: dict, overlapped: bool):
    """:func:`~lecture_lib.profiling.diagnose` of one row of
    :func:`~lecture_lib.data_parallel.emulated.time_at_scale`: exposed share ``exposed / step``,
    busy share the kernels' running time ``forward + backward + optimizer - launch_waits`` over
    the step, the collectives all-reduces."""
    busy = (r["forward"] + r["backward"] + r["optimizer"] - r["launch_waits"]) / r["step"]
    return diagnose(r["exposed"] / r["step"], busy, comm_kinds={"all_reduce"},
                    overlapped=overlapped)
