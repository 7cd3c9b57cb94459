"""Appendix A1's self-study answers: the launcher's cost, and how the course reports real time."""
from __future__ import annotations

import statistics

from . import fmt


def q1_launch_cost() -> list[str]:
    """200 calls of lecture_lib.run: one cold start (3 s) and 199 warm calls (1 ms each),
    against 200 cold starts."""
    calls, cold, warm = 200, 3.0, 1e-3
    pooled = cold + (calls - 1) * warm
    return [fmt(pooled, "s"), fmt(calls * cold, "s")]


def q3_mean_and_median() -> list[str]:
    """Five repeats of one call, the last one disturbed by another program."""
    times_ms = [2, 2, 2, 3, 40]
    return [fmt(statistics.mean(times_ms), "ms"), fmt(statistics.median(times_ms), "ms")]


def q4_separate_runs() -> list[str]:
    """Naive at 0.3 of the ring's time; the ring (4 ms) timed idle, the naive one timed alone
    under a load that makes every message 5 times slower: the ratio reported, against the
    ratio timed back to back."""
    share, ring_ms, load = 0.3, 4.0, 5.0
    naive_loaded = share * ring_ms * load
    return [fmt(naive_loaded, "ms"), fmt(ring_ms, "ms"), f"{naive_loaded / ring_ms:.1f}",
            f"{share:.1f}"]


ANSWERS = {"Q1": q1_launch_cost, "Q3": q3_mean_and_median, "Q4": q4_separate_runs}
