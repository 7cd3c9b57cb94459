"""Appendix A1's self-study answers: the launcher's cost, and how the course reports real time."""
from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
import numpy as np

from ..figures import plots
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


def pairs_figure(ring, naive):
    """Section 1's picture: run 1's calls one by one (left), and every pair's naive / ring ratio
    with each run's median (right). ``ring`` and ``naive``: arrays of seconds, run x pair."""
    runs, pairs = ring.shape
    ratio = naive / ring
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    k = np.arange(1, pairs + 1)
    ax1.plot(k, ring[0] * 1e3, "o", color="#4C72B0", ms=3.5, label="ring")  # independent calls:
    ax1.plot(k, naive[0] * 1e3, "o", color="#DD8452", ms=3.5, label="naive")  # markers, no lines
    ax1.set_yscale("log")
    plots.plain_log_ticks(ax1.yaxis, *ax1.get_ylim(), outer=True)
    ax1.set_xlabel("pair (run 1)")
    ax1.set_ylabel("time (ms, slowest rank)")
    ax1.set_title("1 KiB all-reduce on 4 ranks: each call", fontsize=10)
    ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    jitter = np.random.default_rng(0).uniform(-0.15, 0.15, pairs)
    for r in range(runs):
        ax2.plot(r + 1 + jitter, ratio[r], "o", color="0.6", ms=3.5,
                 label="one pair" if r == 0 else None)
        ax2.plot([r + 0.7, r + 1.3], [np.median(ratio[r])] * 2, color="#DD8452", lw=3,
                 label="the run's median" if r == 0 else None)
    ax2.axhline(1, color="k", ls="--", lw=1, label="equal time")
    ax2.set_yscale("log")
    plots.plain_log_ticks(ax2.yaxis, *ax2.get_ylim(), outer=True)
    ax2.set_xticks(range(1, runs + 1), [f"run {r + 1}" for r in range(runs)])
    ax2.set_ylabel("naive time / ring time")
    ax2.set_title("naive / ring, timed in pairs: three runs", fontsize=10)
    ax2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


ANSWERS = {"Q1": q1_launch_cost, "Q3": q3_mean_and_median, "Q4": q4_separate_runs}
