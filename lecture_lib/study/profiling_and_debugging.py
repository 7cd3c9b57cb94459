"""The profiling notebook's hand calculations: shares of a step and the rules of thumb, the GPipe
bound on a stage's busy share, and what summed gradients do to SGD."""
from __future__ import annotations

from ..costmodel import pipeline_bubble
from ..profiling import diagnose
from . import fmt

COMPUTE_MS, ALLREDUCE_MS, HIDDEN_MS = 120.0, 60.0, 40.0
STAGES, MICRO = 4, 4
RANKS, LR = 8, 0.01


def q1() -> list[str]:
    """Compute 120 ms, an all-reduce of 60 ms of which 40 ms hide behind backward."""
    step = COMPUTE_MS + ALLREDUCE_MS - HIDDEN_MS
    d = diagnose(ALLREDUCE_MS / step, COMPUTE_MS / step, comm_kinds={"all_reduce"})
    assert d.comm_bound and not d.underused
    return [fmt(step, "ms"), fmt(100 * d.comm_share, "%"), fmt(100 * d.busy_share, "%"),
            fmt(100 * (ALLREDUCE_MS - HIDDEN_MS) / step, "%")]


def q2() -> list[str]:
    """GPipe on 4 stages with 4 micro-batches: the most a stage can be busy."""
    busy = 1 - pipeline_bubble(STAGES, MICRO)
    d = diagnose(0.0, busy, comm_kinds={"send", "recv"})
    assert d.underused
    return [fmt(100 * busy, "%")]


def q3() -> list[str]:
    """Gradients summed over 8 ranks with SGD at lr 0.01: the learning rate in effect."""
    return [f"{RANKS * LR:g}"]


ANSWERS = {"Q1": q1, "Q2": q2, "Q3": q3}
