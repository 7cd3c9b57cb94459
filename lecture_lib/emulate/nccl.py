"""Collectives and messages in emulated time (placeholder; being rewritten)."""
from __future__ import annotations

def collective_seconds(kind: str, nbytes: float, p: int, link) -> float:
    """Alpha-beta seconds of one ring collective (see the module docstring)."""
    if p <= 1:
        return 0.0
    a, b = link.alpha, link.beta
    if kind == "all_reduce":
        return 2 * (p - 1) * a + 2 * (p - 1) / p * nbytes / b
    if kind in ("all_gather", "reduce_scatter"):
        return (p - 1) * a + (p - 1) / p * nbytes / b
    if kind in ("all_to_all", "broadcast", "reduce"):
        return (p - 1) * a + nbytes / b
    if kind == "barrier":
        return 2 * (p - 1) * a
    raise ValueError(f"unknown collective {kind!r}")


def p2p_seconds(nbytes: float, link) -> float:
    return link.alpha + nbytes / link.beta


