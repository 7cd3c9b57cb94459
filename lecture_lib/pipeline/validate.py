"""The validator: a schedule is complete, its messages matched, and it cannot deadlock.

:func:`validate` proves a schedule complete (every action exactly once),
every receive matched by its send in the same order on every link, and free of
deadlock: the graph "action a must finish before action b starts" (program
order on each rank, plus data from neighbouring stages, and optionally the
rendezvous a synchronous send makes with its receive) has no cycle
(:func:`dependencies`, :func:`topological_order`).
"""
from __future__ import annotations

from .actions import Action, Schedule


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
    p, m, v = schedule.num_stages, schedule.microbatches, schedule.chunks
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
