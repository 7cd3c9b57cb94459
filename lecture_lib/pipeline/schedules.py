"""Pipeline schedules as data: for every rank, the ordered list of its actions.

A pipeline cuts the model's layers into ``pp`` stages, one per rank, and the batch into
``m`` micro-batches. A stage works on micro-batch i once the stage before has sent i's
activation (F, forward) or the stage after has sent i's gradient (B, backward); until
then it waits: the *bubble*. 1F1B on pp = 4 ranks, m = 4, one time unit per action::

    rank 0  F0 F1 F2 F3 .. .. .. B0 .. B1 .. B2 .. B3
    rank 1  .. F0 F1 F2 .. .. B0 F3 B1 .. B2 .. B3 ..
    rank 2  .. .. F0 F1 .. B0 F2 B1 F3 B2 .. B3 .. ..
    rank 3  .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 .. .. ..

* ``gpipe``: all forwards, then all backwards (Huang et al. 2019). Bubble
  (pp-1)/(m+pp-1); every rank holds the activations of all m micro-batches.
* ``1f1b``: pp - rank - 1 warm-up forwards, then one forward one backward (Narayanan
  et al. 2019, PipeDream-Flush). GPipe's bubble; rank r holds min(m, pp - r).
* ``interleaved-1f1b``: v model chunks per rank; bubble (pp-1)/(v m + pp-1) (Narayanan
  et al. 2021, section 2.2.2).
* ``zb-h1``: 1F1B with the weight gradients W moved into the bubbles (Qi et al. 2024).

:func:`make_schedule` builds one and :func:`~.validate.validate` proves it complete,
matched and free of deadlock.
"""
from __future__ import annotations

import math

from .actions import Action, Schedule
from .validate import validate

NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")


def make_schedule(name: str, num_stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The schedule ``name`` for ``num_stages`` ranks and ``microbatches``, validated.

    >>> print(make_schedule("1f1b", 2, 3))
    1f1b (pp=2, m=3, v=1)
    rank 0: F0 F1 B0 F2 B1 B2
    rank 1: F0 B0 F1 B1 F2 B2
    """
    if name not in NAMES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(NAMES)}")
    for what, value in (("num_stages", num_stages), ("microbatches", microbatches),
                        ("chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a whole number >= 1, not {value!r}")
    p, m, v = num_stages, microbatches, chunks
    if name == "interleaved-1f1b":
        if v < 2:
            raise ValueError("interleaved-1f1b needs chunks >= 2 model chunks per rank "
                             f"(chunks={v}; with one chunk it is plain 1f1b)")
        if m % p:
            raise ValueError(f"interleaved-1f1b needs microbatches to be a multiple of "
                             f"num_stages pp (m >= pp and m % pp == 0): m={m}, pp={p}")
        actions = interleaved_one_f_one_b(p, m, v)
    elif v != 1:
        raise ValueError(f"{name} runs one model chunk per rank (chunks=1), not chunks={v}; "
                         "use 'interleaved-1f1b' for several")
    else:
        actions = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}[name](p, m)
    schedule = Schedule(name, p, m, v, tuple(tuple(a) for a in actions))
    validate(schedule)
    return schedule


def gpipe(p: int, m: int) -> list[list[Action]]:
    """All forwards, then all backwards, on every rank."""
    return [[Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]
            for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """Warm-up forwards, steady one-forward-one-backward, cool-down backwards."""
    schedule = []
    for rank in range(p):
        warmup = min(p - rank - 1, m)
        acts = [Action("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            acts += [Action("F", warmup + i), Action("B", i)]
        acts += [Action("B", i) for i in range(m - warmup, m)]
        schedule.append(acts)
    return schedule


def interleaved_one_f_one_b(p: int, m: int, v: int) -> list[list[Action]]:
    """Megatron-LM's interleaved 1F1B: the k-th forward of a rank works on chunk
    (k // p) % v and micro-batch (k // (p v)) p + k % p; backwards walk the chunks
    in reverse. Warm-up: 2 (p - rank - 1) + (v - 1) p forwards."""
    total = m * v

    def microbatch(k):
        return (k // (p * v)) * p + k % p

    def forward(k):
        return Action("F", microbatch(k), (k // p) % v)

    def backward(k):
        return Action("B", microbatch(k), v - 1 - (k // p) % v)

    schedule = []
    for rank in range(p):
        warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
        acts = [forward(k) for k in range(warmup)]
        for i in range(total - warmup):
            acts += [forward(warmup + i), backward(i)]
        acts += [backward(k) for k in range(total - warmup, total)]
        schedule.append(acts)
    return schedule


def zb_h1(p: int, m: int) -> list[list[Action]]:
    """1F1B's order of F and B (B is the input gradient only, so the stage before gets it
    sooner), with each weight gradient W put where the rank would otherwise wait.

    Placed in unit time steps (F = B = W = 1, the heuristic of Qi et al. 2024): at every
    step each rank starts its next F or B if that action's input has arrived, else its
    oldest waiting W. ZB-H1's memory limit: a rank never holds more micro-batches (forward
    done, W not yet) than 1F1B's peak, min(m, p)."""
    order = [list(acts) for acts in one_f_one_b(p, m)]
    ends: dict = {}                    # (kind, microbatch, rank) -> the step it ends

    def finished(kind: str, microbatch: int, rank: int, t: int) -> bool:
        return ends.get((kind, microbatch, rank), math.inf) <= t

    def input_arrived(a: Action, rank: int, t: int) -> bool:
        if a.kind == "F":              # the activation from the stage before
            return rank == 0 or finished("F", a.microbatch, rank - 1, t)
        if rank == p - 1:              # the last stage starts its backward from its loss
            return finished("F", a.microbatch, rank, t)
        return finished("B", a.microbatch, rank + 1, t)    # the gradient from the stage after

    out: list[list[Action]] = [[] for _ in range(p)]
    waiting_w: list[list[int]] = [[] for _ in range(p)]
    held = [0] * p                     # micro-batches whose activations a rank holds
    t = 0
    while any(order) or any(waiting_w):
        for rank in range(p):
            a = order[rank][0] if order[rank] else None
            memory_allows = a is not None and (a.kind != "F" or held[rank] < min(m, p))
            if memory_allows and input_arrived(a, rank, t):
                out[rank].append(order[rank].pop(0))
                ends[(a.kind, a.microbatch, rank)] = t + 1
                if a.kind == "F":
                    held[rank] += 1
                else:
                    waiting_w[rank].append(a.microbatch)
            elif waiting_w[rank]:
                out[rank].append(Action("W", waiting_w[rank].pop(0)))
                held[rank] -= 1
        t += 1
    return out
