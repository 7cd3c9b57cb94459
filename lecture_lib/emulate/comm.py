"""Communication in virtual time: real collectives, charged by size, started when all are ready.

While the emulation is on, this rank's ``torch.distributed`` functions are
wrapped (:mod:`.session` installs them). A wrapped collective runs the real
operation on the real tensors and charges the rank's comm stream what the
cluster takes for its size on the group's ranks (``Cluster.collective_seconds``);
with ``async_op=True`` it returns an :class:`EmulatedWork` whose ``wait()``
makes the compute stream wait for its end, so it overlaps the compute issued
after it. Messages are in :mod:`.p2p`.

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

The dry run (``emulated(..., dry_run=True)``) skips the data of every
collective (fake tensors have none: outputs keep their fake contents, an
asynchronous call returns a completed work) and agrees on times as above,
with real tensors made outside the fake mode.
"""
from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .nccl import collective_seconds, p2p_seconds  # noqa: F401  (re-exported)

COLLECTIVES = ["all_reduce", "all_gather_single", "all_gather_into_tensor",
               "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all_single",
               "all_to_all", "all_gather", "reduce_scatter", "broadcast", "reduce", "barrier"]
P2P = ["send", "recv", "isend", "irecv", "batch_isend_irecv"]
ORIGINAL = {name: getattr(c10d, name) for name in COLLECTIVES + P2P if hasattr(c10d, name)}
_DEFAULTS = {name: {k: p.default for k, p in inspect.signature(f).parameters.items()}
             for name, f in ORIGINAL.items()}
_EMPTY = inspect.Parameter.empty
_KIND = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
         "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
         "all_to_all_single": "all_to_all"}


def arguments(name: str, args, kwargs) -> dict:
    """The call's arguments by name, defaults filled in (``Signature.bind``, without its cost:
    every parameter of these functions is positional-or-keyword)."""
    names = _DEFAULTS[name]
    a = dict(names)
    a.update(zip(names, args))
    a.update(kwargs)
    if len(args) > len(names) or len(a) > len(names) or any(v is _EMPTY for v in a.values()):
        raise TypeError(f"{name}() does not take these arguments: {args}, {kwargs}")
    return a


def _group(group):
    """The process group itself (``None`` is the world's)."""
    return dist.group.WORLD if group is None else group


def nbytes_of(t) -> int:
    if isinstance(t, (list, tuple)):
        return sum(nbytes_of(x) for x in t)
    return t.numel() * t.element_size()


class State:
    """What the wrappers share on one rank: the clock, the cluster, the open batch."""

    def __init__(self, clock, cluster, dry_run: bool = False):
        self.clock, self.cluster, self.dry_run = clock, cluster, dry_run
        self.depth = 0                  # > 0 inside a wrapper: nested calls pass through
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self._ranks: dict = {}
        self.batch: Batch | None = None     # collectives whose start is not agreed yet
        self.tail: Pending | None = None    # the last asynchronous one, until recorded
        self.count: dict = {}               # collectives issued so far, per group
        self._costs: dict = {}              # (kind, bytes, group) -> seconds

    def charging(self) -> bool:
        return self.depth == 0

    def quiet(self) -> Quiet:
        """Bookkeeping that must charge nothing and wrap nothing."""
        return Quiet(self, real=False)

    def real(self) -> Quiet:
        """Quiet, on real tensors even in the dry run, past every dispatch mode: the data
        of a collective and the times the ranks exchange (the compute mode charges neither)."""
        return Quiet(self, real=True)

    def ranks(self, group) -> list[int]:
        if group not in self._ranks:
            self._ranks[group] = dist.get_process_group_ranks(_group(group))
        return self._ranks[group]

    def cost(self, kind: str, nbytes: int, group, ranks: list[int]) -> float:
        """``Cluster.collective_seconds``, once per kind, size and group."""
        key = (kind, nbytes, _group(group))
        seconds = self._costs.get(key)
        if seconds is None:
            seconds = self._costs[key] = self.cluster.collective_seconds(kind, nbytes, ranks)
        return seconds

    def clear(self) -> None:
        """Forget what is pending (a failed rank must not wait for its peers)."""
        self.batch = self.tail = None


class Quiet:
    """The context of :meth:`State.quiet` and :meth:`State.real` (a class: they run per call)."""
    __slots__ = ("state", "guards")

    def __init__(self, state: State, real: bool):
        self.state = state
        self.guards = [] if not real else [torch._C._DisableTorchDispatch()] + (
            [unset_fake_temporarily()] if state.dry_run else [])

    def __enter__(self):
        self.state.depth += 1
        for guard in self.guards:
            guard.__enter__()

    def __exit__(self, *exc):
        for guard in reversed(self.guards):
            guard.__exit__(*exc)
        self.state.depth -= 1


class EmulatedWork:
    """A real ``Work`` (none in the dry run) whose ``wait()`` also makes the compute stream
    wait for its end."""

    def __init__(self, works, state, end):
        self._works, self._state, self._end = [w for w in works if w is not None], state, end

    def wait(self, timeout=None):
        with self._state.quiet():
            for w in self._works:
                w.wait() if timeout is None else w.wait(timeout)
            end = self._end()
        self._state.clock.wait_until(end)
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def __getattr__(self, name):
        if not self._works:
            raise AttributeError(f"a dry run's work has no {name!r}")
        return getattr(self._works[0], name)


class Once:
    """A deferred computation that runs once (quietly) and remembers its value."""

    def __init__(self, state, fn):
        self.state, self.fn, self.done, self.value = state, fn, False, None

    def __call__(self):
        if not self.done:
            with self.state.quiet():
                self.value, self.done = self.fn(), True
        return self.value


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


def _agree(state: State, batch: Batch):
    """Issue the batch's all-reduce (MAX) now; return what waits for it and sets the starts."""
    ops, n = batch.ops, len(batch.ops)
    times = [batch.first, -batch.first] + [op.ready for op in ops] + [op.cost for op in ops]
    work = vector = None
    if len(batch.ranks) > 1:
        with state.real():
            vector = torch.tensor(times, dtype=torch.float64)
            work = ORIGINAL["all_reduce"](vector, op=dist.ReduceOp.MAX, group=batch.group,
                                          async_op=True)

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
                "synchronize and switch groups at the same place (lecture_lib.emulate.comm)")
        previous_end = None
        for op, ready, cost in zip(ops, agreed[2:2 + n], agreed[2 + n:]):
            op.start = ready if previous_end is None else max(ready, previous_end)
            previous_end = op.start + cost
    return finish


def _record(state: State, op: Pending) -> None:
    """Put an agreed collective on the comm stream and in the timeline (once)."""
    if not op.recorded:
        op.recorded = True
        state.clock.comm_span(op.kind, op.start, op.start + op.cost, op.nbytes)
        if state.tail is op:
            state.tail = None


def close(state: State) -> None:
    """Agree on the open batch (one all-reduce) and record all of it but the tail."""
    batch, state.batch = state.batch, None
    if batch is not None:
        _agree(state, batch)()
        for op in batch.ops:
            if op is not state.tail:
                _record(state, op)


def _before_collective(state: State, group) -> None:
    """A new collective on ``group``: another group's batch is agreed and recorded; the
    previous collective, agreed, is recorded (it was, in issue order, before this one)."""
    if state.batch is not None and state.batch.group is not _group(group):
        close(state)
    if state.tail is not None and state.tail.start is not None:
        _record(state, state.tail)


def _join(state: State, group, ranks: list[int], op: Pending) -> Batch:
    group = _group(group)
    if state.batch is None:
        state.batch = Batch(group, ranks, state.count.get(group, 0))
    state.count[group] = state.count.get(group, 0) + 1
    state.batch.ops.append(op)
    return state.batch


def _resolve(state: State, op: Pending) -> float:
    """The end of an asynchronous collective (its batch agreed first if need be)."""
    if op.start is None:
        close(state)
    _record(state, op)
    return op.start + op.cost


_BUFFER = {"all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor",
           "all_gather_single": "output_tensor", "all_gather_into_tensor": "output_tensor",
           "reduce_scatter_single": "input", "reduce_scatter_tensor": "input",
           "all_gather": "tensor_list", "reduce_scatter": "input_list"}


def _size(name: str, a: dict, me: int) -> int:
    """The buffer's bytes (all-to-all: what this rank sends to the others)."""
    if name in _BUFFER:
        return nbytes_of(a[_BUFFER[name]])
    if name == "all_to_all":
        return sum(nbytes_of(t) for i, t in enumerate(a["input_tensor_list"]) if i != me)
    if name == "all_to_all_single":
        x, splits = a["input"], a["input_split_sizes"]
        total = nbytes_of(x)
        if splits:
            return total - splits[me] * (total // max(1, x.shape[0]))
        return total - total // len(a["_ranks"])
    return 0                                                   # barrier


def _collective(state: State, name: str, args, kwargs):
    a = arguments(name, args, kwargs)
    group, async_op = a.get("group"), bool(a.get("async_op", False))
    ranks = state.ranks(group)
    if state.rank not in ranks:
        return ORIGINAL[name](*args, **kwargs)
    a["_ranks"] = ranks
    clock, kind = state.clock, _KIND.get(name, name)
    nbytes = _size(name, a, ranks.index(state.rank))
    _before_collective(state, group)
    clock.issued.append((kind, clock.compute, nbytes))
    op = Pending(kind, nbytes, max(clock.compute, clock.comm),
                 state.cost(kind, nbytes, group, ranks))
    batch = _join(state, group, ranks, op)
    if not async_op:                       # agree on the batch and this one, with the data
        state.batch = None
        finish = _agree(state, batch)
    work = None
    if not state.dry_run:
        with state.real():
            work = ORIGINAL[name](*args, **kwargs)
    if not async_op:
        finish()
        for pending in batch.ops:
            _record(state, pending)
        clock.wait_until(op.start + op.cost)
        return work
    end = Once(state, lambda: _resolve(state, op))
    clock.defer(end)
    state.tail = op
    return EmulatedWork([work], state, end)
