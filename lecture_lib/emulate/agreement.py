"""When a collective starts: the ranks of its group agree, a batch of collectives at a time.

A collective starts when every rank of the group has issued it and its comm
stream is free. A rank knows only its own *ready* time, ``max(compute,
comm)`` at the issue; the ranks agree on the latest with a tiny real
all-reduce (MAX, float64). One per collective costs a round trip each, which
a communication-bound run pays in real time, so the collectives issued
asynchronously on one group form a *batch*: each is issued at once, its ready
time ``r`` and cost ``c`` written down, and when a time is needed one
all-reduce of the batch's ``r`` and ``c`` (MAX over ranks: ``R``, ``C``; an
uneven all-to-all costs each rank differently) gives every start:

    start_1 = R_1,        start_k = max(R_k, start_{k-1} + C_{k-1})

the floats one agreement per collective gives (max is exact; the largest
``start + c`` is ``start`` plus the largest ``c``) while no other collective
enters this rank's comm stream. A batch is agreed (*closed*) at a ``wait()``
on one of its collectives; at ``clock.resolve()``, ``synchronize()``,
``timeline()``, ``summary()`` and the end of the block; at a synchronous
collective on its group (whose ready time joins the batch's all-reduce,
issued before the data as for a lone one); at a collective on another group.
A send does not close it (see :mod:`.p2p`). A span is recorded at the
agreement rather than at the next issue, so compute spans break less often.

Agreeing is a collective, so every rank must agree at the same place: a
batch's all-reduce takes a place in its group's sequence of collectives, and
every rank of the group must close the batch after the same collectives and
before the same ones, or one rank's agreement meets another's data (one rank
waits after its first collective while a peer issues a second). Ranks that
run the same code do (their waits, synchronizations and other groups'
collectives are on the same lines), as every scheme of the course does; ranks
of a group that diverge (one waits, or uses a subgroup, where another does
not) must first wait for their asynchronous collectives. To fail loudly, the
vector starts with the group's index of the batch's first collective and its
negative: after the MAX they differ unless every rank closed the same batch,
and the rank raises (gloo stops a vector meeting data of another size).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

# Every function takes the rank's ``state`` (:class:`.comm.State`): its clock, its open batch
# (``state.batch``), its last asynchronous collective not yet recorded (``state.tail``).

class Pending:
    """One collective on this rank: ready time and cost; its start once the ranks agree."""
    __slots__ = ("kind", "nbytes", "ready", "cost", "start", "recorded")

    def __init__(self, kind: str, nbytes: int, ready: float, cost: float):
        self.kind, self.nbytes, self.ready, self.cost = kind, nbytes, ready, cost
        self.start, self.recorded = None, False


class Batch:
    """Collectives issued on one group, starts not agreed yet (``first``: the group's index
    of the first, the same on every rank running the same program)."""

    def __init__(self, group, ranks: list[int], first: int):
        self.group, self.ranks, self.first, self.ops = group, ranks, first, []


def agree(state, batch: Batch):
    """Issue the batch's all-reduce (MAX) now; return what waits for it and sets the starts."""
    ops, n = batch.ops, len(batch.ops)
    times = [batch.first, -batch.first] + [op.ready for op in ops] + [op.cost for op in ops]
    work = vector = None
    if len(batch.ranks) > 1:
        with state.real():
            vector = torch.tensor(times, dtype=torch.float64)
            work = state.original["all_reduce"](vector, op=dist.ReduceOp.MAX,
                                                group=batch.group, async_op=True)

    def finish() -> None:
        agreed = times
        if work is not None:
            with state.real():
                work.wait()
                agreed = vector.tolist()
        if agreed[0] != -agreed[1]:
            raise RuntimeError(
                f"emulate: rank {state.rank} agreed on the times of collectives {batch.first}.. "
                f"of the group {batch.ranks} while another rank agreed on collectives "
                f"{int(-agreed[1])}..{int(agreed[0])}: every rank of a group must wait, "
                "synchronize and switch groups at the same place (lecture_lib.emulate.agreement)")
        previous_end = None
        for op, ready, cost in zip(ops, agreed[2:2 + n], agreed[2 + n:]):
            op.start = ready if previous_end is None else max(ready, previous_end)
            previous_end = op.start + cost
    return finish


def record(state, op: Pending) -> None:
    """Put an agreed collective on the comm stream and in the timeline (once)."""
    if not op.recorded:
        op.recorded = True
        state.clock.comm_span(op.kind, op.start, op.start + op.cost, op.nbytes)
        if state.tail is op:
            state.tail = None


def close(state) -> None:
    """Agree on the open batch (one all-reduce) and record all of it but the tail."""
    batch, state.batch = state.batch, None
    if batch is not None:
        agree(state, batch)()
        for op in batch.ops:
            if op is not state.tail:
                record(state, op)


def before_collective(state, group) -> None:
    """A new collective on ``group``: another group's batch is agreed and recorded; the
    previous collective, agreed, is recorded (it was, in issue order, before this one)."""
    if state.batch is not None and state.batch.group is not group:
        close(state)
    if state.tail is not None and state.tail.start is not None:
        record(state, state.tail)


def join(state, group, ranks: list[int], op: Pending) -> Batch:
    """Add ``op`` to the open batch on ``group`` (a new one if none is open)."""
    if state.batch is None:
        state.batch = Batch(group, ranks, state.count.get(group, 0))
    state.count[group] = state.count.get(group, 0) + 1
    state.batch.ops.append(op)
    return state.batch


def resolve(state, op: Pending) -> float:
    """The end of an asynchronous collective (its batch agreed first if need be)."""
    if op.start is None:
        close(state)
    record(state, op)
    return op.start + op.cost


