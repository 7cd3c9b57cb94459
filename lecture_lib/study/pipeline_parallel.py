"""The pipeline-parallel notebook: the numbers of the self-study answers.

Q1: the bubble of 1F1B and of interleaved 1F1B (Narayanan et al. 2021, section 2.2);
Q2: activations held at rank 0's peak, GPipe against 1F1B (section 2.2.1);
Q3: ZB-H1's bubble against 1F1B's with equal F, B, W (Qi et al. 2024, section 2.1).
"""
from __future__ import annotations

from ..costmodel import peak_microbatches, pipeline_bubble, zb_h1_bubble
from . import fmt


def q1_bubbles(p: int = 8, m: int = 32, v: int = 4) -> list[str]:
    """(p-1)/(m+p-1) and (p-1)/(v m+p-1), in percent."""
    return [fmt(100 * pipeline_bubble(p, m), "%"), fmt(100 * pipeline_bubble(p, m, v), "%")]


def q2_activations(p: int = 8, m: int = 32, gb_per_microbatch: float = 2.0) -> list[str]:
    """Rank 0's peak activation memory: GPipe holds m micro-batches, 1F1B min(m, p)."""
    return [fmt(peak_microbatches(s, p, m, 0) * gb_per_microbatch, "GB")
            for s in ("gpipe", "1f1b")]


def q3_zero_bubble(p: int = 4, m: int = 8, t: float = 1.0) -> list[str]:
    """1F1B's and ZB-H1's bubble with t_F = t_B = t_W = t, in percent."""
    return [fmt(100 * pipeline_bubble(p, m), "%"), fmt(100 * zb_h1_bubble(p, m, t, t, t), "%")]


ANSWERS = {"Q1": q1_bubbles, "Q2": q2_activations, "Q3": q3_zero_bubble}
