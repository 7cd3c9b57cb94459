"""The pipeline-parallel notebook: the numbers of the self-study answers.

Q1: the bubble of 1F1B and of interleaved 1F1B, and interleaving's price in messages
(Narayanan et al. 2021, section 2.2);
Q2: activations held at rank 0's peak, GPipe against 1F1B (section 2.2.1);
Q3: ZB-H1's bubble against 1F1B's with equal F, B, W (Qi et al. 2024, section 2.1);
Q5: what if one stage is slower: the step and bubble of unequal stages, against the same
work cut evenly, with more micro-batches, and the bubble's floor as m grows.
``pp`` is the number of pipeline stages (the papers' p).
"""
from __future__ import annotations

from ..costmodel import (
    peak_microbatches,
    pipeline_bubble,
    pipeline_bubble_unequal,
    pipeline_step_time,
    zb_h1_bubble,
)
from . import fmt


def q1_bubbles(pp: int = 8, m: int = 32, v: int = 4) -> list[str]:
    """(pp-1)/(m+pp-1) and (pp-1)/(v m+pp-1), in percent; and the price in messages: a
    micro-batch crosses v pp - 1 boundaries between ranks each way instead of pp - 1."""
    return [fmt(100 * pipeline_bubble(pp, m), "%"), fmt(100 * pipeline_bubble(pp, m, v), "%"),
            fmt((v * pp - 1) / (pp - 1), "times as many messages")]


def q2_activations(pp: int = 8, m: int = 32, gb_per_microbatch: float = 2.0) -> list[str]:
    """Rank 0's peak activation memory: GPipe holds m micro-batches, 1F1B min(m, pp)."""
    return [fmt(peak_microbatches(s, pp, m, 0) * gb_per_microbatch, "GB")
            for s in ("gpipe", "1f1b")]


def q3_zero_bubble(pp: int = 4, m: int = 8, t: float = 1.0) -> list[str]:
    """1F1B's and ZB-H1's bubble with t_F = t_B = t_W = t, in percent."""
    return [fmt(100 * pipeline_bubble(pp, m), "%"), fmt(100 * zb_h1_bubble(pp, m, t, t, t), "%")]


def q5_unequal_stages(times: tuple = (1.0, 1.0, 1.0, 2.0), m: int = 8) -> list[str]:
    """Stage times t_i (units): step (m-1) max t_i + sum t_i and its bubble; the same work cut
    evenly; the unequal bubble at 2m; and its limit as m grows, 1 - mean t_i / max t_i."""
    even = [sum(times) / len(times)] * len(times)
    floor = 1 - sum(times) / len(times) / max(times)
    return [fmt(pipeline_step_time(times, m), "units"),
            fmt(100 * pipeline_bubble_unequal(times, m), "%"),
            fmt(pipeline_step_time(even, m), "units"),
            fmt(100 * pipeline_bubble_unequal(even, m), "%"),
            fmt(100 * pipeline_bubble_unequal(times, 2 * m), "%"),
            fmt(100 * floor, "%")]


ANSWERS = {"Q1": q1_bubbles, "Q2": q2_activations, "Q3": q3_zero_bubble,
           "Q5": q5_unequal_stages}
