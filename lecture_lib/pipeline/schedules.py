"""Pipeline schedules as data: who does which forward and backward, in what order.

The idea
--------
Pipeline parallelism cuts a model's layers into ``pp`` contiguous *stages*, one
per rank, and cuts the batch into ``m`` *micro-batches*. A stage can only
work on micro-batch ``i`` once the stage before it has sent ``i``'s
activation (forward) or the stage after it has sent ``i``'s gradient
(backward), so some ranks wait: the *bubble*. A schedule is nothing more than,
for every rank, the ordered list of actions it performs:

* ``F`` forward of a micro-batch through one model chunk,
* ``B`` backward (the input gradient; the whole backward unless the schedule
  also has ``W``),
* ``W`` the weight gradient, split off ``B`` by zero-bubble schedules.

Four schedules, each a pure function of (pp, m[, v]) (``p`` in the code below):

* ``gpipe``: all forwards, then all backwards (Huang et al. 2019, "GPipe").
  Bubble (pp-1)/(m+pp-1); each rank holds the activations of all m micro-batches.
* ``1f1b``: ``pp - rank - 1`` warm-up forwards, then one forward one backward,
  then the remaining backwards (Narayanan et al. 2019, "PipeDream"; Megatron-LM's
  "PipeDream-Flush"). Same bubble, but rank r holds at most min(m, pp - r).
* ``interleaved-1f1b``: every rank holds ``v`` chunks (rank r holds virtual
  stages r, r + pp, ...); bubble (pp-1)/(v m + pp-1) (Narayanan et al. 2021,
  "Efficient Large-Scale Language Model Training on GPU Clusters using
  Megatron-LM", section 2.2.2). Needs m to be a multiple of pp.
* ``zb-h1``: 1F1B's order of F and B, with the weight gradients W moved into
  what would be bubbles, every rank holding pp micro-batches, 1F1B's peak on rank 0
  (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", schedule ZB-H1).

:func:`~.validate.validate` proves a schedule complete (every action exactly once),
every receive matched by its send in the same order on every link, and free of
deadlock: the graph "action a must finish before action b starts" (program
order on each rank, plus data from neighbouring stages, and optionally the
rendezvous a synchronous send makes with its receive) has no cycle.
"""
from __future__ import annotations

from .actions import Action, Schedule
from .validate import validate

NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")


# ----------------------------------------------------------------------------
# The four schedules
# ----------------------------------------------------------------------------

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
    """1F1B's order of F and B (B = input gradient only, so it is shorter and the
    gradient reaches the stage before sooner); each W is placed where the rank
    would otherwise wait. Placed by list-scheduling with unit costs (F = B = W = 1),
    the heuristic of Qi et al. (2024), with the memory limit of ZB-H1: a rank never
    holds more micro-batches (forward done, W not yet done) than 1F1B's peak,
    min(m, p)."""
    order = one_f_one_b(p, m)
    cap = min(m, p)
    done: dict[tuple[str, int, int], int] = {}          # (kind, mb, rank) -> end time
    pos = [0] * p
    waiting_w: list[list[int]] = [[] for _ in range(p)]
    held = [0] * p
    out: list[list[Action]] = [[] for _ in range(p)]
    t = 0
    while any(pos[r] < len(order[r]) or waiting_w[r] for r in range(p)):
        started = []
        for r in range(p):
            nxt = order[r][pos[r]] if pos[r] < len(order[r]) else None
            ready = False
            if nxt is not None and nxt.kind == "F":
                ready = held[r] < cap and (r == 0 or done.get(("F", nxt.microbatch, r - 1),
                                                                 t + 1) <= t)
            elif nxt is not None:
                dep = ("F", nxt.microbatch, r) if r == p - 1 else ("B", nxt.microbatch, r + 1)
                ready = done.get(dep, t + 1) <= t
            if ready:
                pos[r] += 1
                out[r].append(nxt)
                if nxt.kind == "F":
                    held[r] += 1
                else:
                    waiting_w[r].append(nxt.microbatch)
                started.append((nxt.kind, nxt.microbatch, r))
            elif waiting_w[r]:
                i = waiting_w[r].pop(0)
                out[r].append(Action("W", i))
                held[r] -= 1
        for key in started:
            done[key] = t + 1
        t += 1
    return out


def make_schedule(name: str, num_stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The schedule ``name`` for ``num_stages`` ranks and ``microbatches``, validated.

    >>> print(make_schedule("1f1b", 2, 3))
    1f1b (pp=2, m=3, v=1)
    rank 0: F0 F1 B0 F2 B1 B2
    rank 1: F0 B0 F1 B1 F2 B2
    """
    if name not in NAMES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(NAMES)}")
    _positive("num_stages", num_stages)
    _positive("microbatches", microbatches)
    _positive("chunks", chunks)
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
