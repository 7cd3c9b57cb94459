"""Pipeline schedules as data: who does which forward and backward, in what order.

The idea
--------
Pipeline parallelism cuts a model's layers into ``p`` contiguous *stages*, one
per rank, and cuts the batch into ``m`` *micro-batches*. A stage can only
work on micro-batch ``i`` once the stage before it has sent ``i``'s
activation (forward) or the stage after it has sent ``i``'s gradient
(backward), so some ranks wait: the *bubble*. A schedule is nothing more than,
for every rank, the ordered list of actions it performs:

* ``F`` forward of a micro-batch through one model chunk,
* ``B`` backward (the input gradient; the whole backward unless the schedule
  also has ``W``),
* ``W`` the weight gradient, split off ``B`` by zero-bubble schedules.

Four schedules, each a pure function of (p, m[, v]):

* ``gpipe``: all forwards, then all backwards (Huang et al. 2019, "GPipe").
  Bubble (p-1)/(m+p-1); each rank holds the activations of all m micro-batches.
* ``1f1b``: ``p - rank - 1`` warm-up forwards, then one forward one backward,
  then the remaining backwards (Narayanan et al. 2019, "PipeDream"; Megatron-LM's
  "PipeDream-Flush"). Same bubble, but rank r holds at most min(m, p - r).
* ``interleaved-1f1b``: every rank holds ``v`` chunks (rank r holds virtual
  stages r, r + p, ...); bubble (p-1)/(v m + p-1) (Narayanan et al. 2021,
  "Efficient Large-Scale Language Model Training on GPU Clusters using
  Megatron-LM", section 2.2.2). Needs m to be a multiple of p.
* ``zb-h1``: 1F1B's order of F and B, with the weight gradients W moved into
  what would be bubbles, without holding more micro-batches than 1F1B's peak
  (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", schedule ZB-H1).

:func:`validate` proves a schedule complete (every action exactly once),
every receive matched by its send in the same order on every link, and free of
deadlock: the graph "action a must finish before action b starts" (program
order on each rank, plus data from neighbouring stages, and optionally the
rendezvous a synchronous send makes with its receive) has no cycle.
"""
from __future__ import annotations

from dataclasses import dataclass, field

NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")


@dataclass(frozen=True, order=True)
class Action:
    """One unit of work on one rank: ``kind`` in F/B/W, a micro-batch, a model chunk."""
    kind: str
    microbatch: int
    chunk: int = 0

    def __str__(self):
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


@dataclass(frozen=True)
class Schedule:
    """``actions[rank]`` is the ordered list of that rank's actions.

    Rank ``r``'s chunk ``c`` is virtual stage ``c * p + r`` (Megatron-LM's
    interleaved layout); with one chunk, rank r is stage r.
    """
    name: str
    num_stages: int
    num_microbatches: int
    chunks: int
    actions: tuple = field(repr=False)

    @property
    def num_virtual_stages(self) -> int:
        return self.num_stages * self.chunks

    @property
    def split_backward(self) -> bool:
        """True when the backward is split into B (input gradient) and W (weights)."""
        return any(a.kind == "W" for acts in self.actions for a in acts)

    def stage(self, rank: int, chunk: int) -> int:
        return chunk * self.num_stages + rank

    def rank_of(self, stage: int) -> int:
        return stage % self.num_stages

    def chunk_of(self, stage: int) -> int:
        return stage // self.num_stages

    def __str__(self):
        rows = [f"rank {r}: " + " ".join(map(str, acts)) for r, acts in enumerate(self.actions)]
        return f"{self.name} (p={self.num_stages}, m={self.num_microbatches}, " \
               f"v={self.chunks})\n" + "\n".join(rows)


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


def make_schedule(name: str, num_stages: int, num_microbatches: int, chunks: int = 1) -> Schedule:
    """The schedule ``name`` for ``num_stages`` ranks and ``num_microbatches``, validated.

    >>> print(make_schedule("1f1b", 2, 3))
    1f1b (p=2, m=3, v=1)
    rank 0: F0 F1 B0 F2 B1 B2
    rank 1: F0 B0 F1 B1 F2 B2
    """
    if name not in NAMES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(NAMES)}")
    _positive("num_stages", num_stages)
    _positive("num_microbatches", num_microbatches)
    _positive("chunks", chunks)
    p, m, v = num_stages, num_microbatches, chunks
    if name == "interleaved-1f1b":
        if v < 2:
            raise ValueError("interleaved-1f1b needs chunks >= 2 model chunks per rank "
                             f"(chunks={v}; with one chunk it is plain 1f1b)")
        if m % p:
            raise ValueError(f"interleaved-1f1b needs num_microbatches to be a multiple of "
                             f"num_stages (m >= p and m % p == 0): m={m}, p={p}")
        actions = interleaved_one_f_one_b(p, m, v)
    elif v != 1:
        raise ValueError(f"{name} runs one model chunk per rank (chunks=1), not chunks={v}; "
                         "use 'interleaved-1f1b' for several")
    else:
        actions = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}[name](p, m)
    schedule = Schedule(name, p, m, v, tuple(tuple(a) for a in actions))
    validate(schedule)
    return schedule


# ----------------------------------------------------------------------------
# The validator
# ----------------------------------------------------------------------------

def messages(schedule: Schedule) -> list[tuple[tuple[int, int], tuple[int, int], str]]:
    """Every message between ranks: ``(sender (rank, index), receiver (rank, index), what)``.

    F on virtual stage s < last sends its output to F of s + 1; B on stage s > 0
    sends the input gradient to B of s - 1. Hand-offs within one rank are no messages.
    """
    where = _positions(schedule)
    last, out = schedule.num_virtual_stages - 1, []
    for (kind, mb, s), (rank, i) in sorted(where.items(), key=lambda kv: kv[1]):
        if kind == "F" and s < last:
            to = where.get(("F", mb, s + 1))
        elif kind == "B" and s > 0:
            to = where.get(("B", mb, s - 1))
        else:
            continue
        if to is not None and to[0] != rank:
            out.append(((rank, i), to, f"{'activation' if kind == 'F' else 'gradient'} "
                                        f"of micro-batch {mb}, stage {s}"))
    return out


def _positions(schedule: Schedule) -> dict:
    where = {}
    for rank, acts in enumerate(schedule.actions):
        for i, a in enumerate(acts):
            where[(a.kind, a.microbatch, schedule.stage(rank, a.chunk))] = (rank, i)
    return where


def dependencies(schedule: Schedule, synchronous_sends: bool = False) -> dict:
    """``deps[(rank, i)]``: the actions that must finish before action i of rank starts.

    Program order, data (the activation from the stage before, the gradient from
    the stage after, this stage's own forward before its backward, B before W)
    and, with ``synchronous_sends``, the rendezvous of a send that completes only
    when the peer posts its receive (as NCCL's batched send/recv may): the
    sender's next action waits until the receiver finished the action before
    the one that receives.
    """
    where = _positions(schedule)
    last = schedule.num_virtual_stages - 1
    deps: dict = {}
    for rank, acts in enumerate(schedule.actions):
        for i, a in enumerate(acts):
            need = set()
            if i:
                need.add((rank, i - 1))
            s = schedule.stage(rank, a.chunk)
            if a.kind == "F" and s > 0:
                need.add(where[("F", a.microbatch, s - 1)])
            if a.kind == "B":
                need.add(where[("F", a.microbatch, s)])
                if s < last:
                    need.add(where[("B", a.microbatch, s + 1)])
            if a.kind == "W":
                need.add(where[("B", a.microbatch, s)])
            deps[(rank, i)] = need
    if synchronous_sends:
        for (src, i), (dst, j), _ in messages(schedule):
            if i + 1 < len(schedule.actions[src]) and j > 0:
                deps[(src, i + 1)].add((dst, j - 1))
    return deps


def validate(schedule: Schedule, synchronous_sends: bool = False) -> Schedule:
    """Raise ValueError unless the schedule is complete, matched and deadlock-free.

    Deadlock-free for an executor whose sends never wait for their receiver
    (gloo's isend; the executor waits for its sends at the end of the step);
    with ``synchronous_sends`` also for one whose send completes only when the
    peer has posted the receive (a stricter test that GPipe, 1F1B and ZB-H1
    pass and Megatron's interleaved order does not: Megatron-LM runs it with
    every rank exchanging in lock-step).
    """
    p, m, v = schedule.num_stages, schedule.num_microbatches, schedule.chunks
    if len(schedule.actions) != p:
        raise ValueError(f"{schedule.name}: {len(schedule.actions)} action lists for {p} stages")
    kinds = ("F", "B", "W") if schedule.split_backward else ("F", "B")
    for rank, acts in enumerate(schedule.actions):
        expected = {Action(k, i, c) for k in kinds for i in range(m) for c in range(v)}
        seen = set()
        for a in acts:
            if a not in expected:
                raise ValueError(f"{schedule.name}: rank {rank} has an impossible action {a} "
                                 f"(kind in {kinds}, micro-batch < {m}, chunk < {v})")
            if a in seen:
                raise ValueError(f"{schedule.name}: rank {rank} does {a} twice")
            seen.add(a)
        if seen != expected:
            missing = " ".join(map(str, sorted(expected - seen)))
            raise ValueError(f"{schedule.name}: rank {rank} never does {missing}")
    # every receive has its send, in the same order on every link (what NCCL, which
    # matches messages between two ranks in order, needs)
    links: dict = {}
    for (src, i), (dst, j), what in messages(schedule):
        links.setdefault((src, dst), []).append((i, j, what))
    for (src, dst), msgs in links.items():
        by_send = [what for _, _, what in sorted(msgs)]
        by_recv = [what for _, _, what in sorted(msgs, key=lambda x: x[1])]
        if by_send != by_recv:
            k = next(n for n, (a, b) in enumerate(zip(by_send, by_recv)) if a != b)
            raise ValueError(f"{schedule.name}: rank {dst} receives '{by_recv[k]}' from rank "
                             f"{src} where rank {src} sends '{by_send[k]}': messages on a link "
                             "must be received in the order they are sent")
    order = topological_order(schedule, synchronous_sends)
    if len(order) < sum(len(a) for a in schedule.actions):
        stuck = sorted(set(dependencies(schedule, synchronous_sends)) - set(order))
        rank, i = stuck[0]
        raise ValueError(f"{schedule.name}: deadlock: the actions wait on each other in a "
                         f"cycle; rank {rank} never gets past action {i} "
                         f"({schedule.actions[rank][i]}); stuck: "
                         + ", ".join(f"rank {r}:{schedule.actions[r][k]}" for r, k in stuck[:8]))
    return schedule


def topological_order(schedule: Schedule, synchronous_sends: bool = False) -> list:
    """The actions in an order that respects every dependency (Kahn's algorithm);
    shorter than the number of actions when there is a cycle."""
    deps = dependencies(schedule, synchronous_sends)
    waiting = {node: len(need) for node, need in deps.items()}
    users: dict = {node: [] for node in deps}
    for node, need in deps.items():
        for d in need:
            users[d].append(node)
    ready = sorted(node for node, n in waiting.items() if n == 0)
    order = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for u in users[node]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    return order
