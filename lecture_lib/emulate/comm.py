"""Communication in virtual time: real collectives, charged by size, started when all are ready.

While the emulation is on, this rank's ``torch.distributed`` functions are
wrapped (:mod:`.session` installs them). A wrapped collective runs the real
operation on the real tensors and charges the rank's comm stream what the
cluster takes for its size on the group's ranks (``Cluster.collective_seconds``);
with ``async_op=True`` it returns an :class:`EmulatedWork` whose ``wait()``
makes the compute stream wait for its end, so it overlaps the compute issued
after it. A collective starts when every rank of the group has issued it and
its comm stream is free: the ranks agree on when (:mod:`.agreement`).
Messages are in :mod:`.p2p`.

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

from .agreement import Batch, Pending, agree, before_collective, join, record, resolve
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


def _collective(state: State, name: str, args, kwargs):
    """One wrapped collective: charged on the comm stream from when its group agrees it
    starts; the real operation runs on the real tensors (not in the dry run)."""
    a = arguments(name, args, kwargs)
    group, async_op = _group(a.get("group")), bool(a.get("async_op", False))
    ranks = state.ranks(group)
    if state.rank not in ranks:
        return ORIGINAL[name](*args, **kwargs)
    a["_ranks"] = ranks
    clock, kind = state.clock, _KIND.get(name, name)
    nbytes = _size(name, a, ranks.index(state.rank))
    before_collective(state, group)
    clock.issued.append((kind, clock.compute, nbytes))
    op = Pending(kind, nbytes, max(clock.compute, clock.comm),
                 state.cost(kind, nbytes, group, ranks))
    batch = join(state, group, ranks, op)
    if not async_op:                       # agree on the batch and this one, with the data
        state.batch = None
        finish = agree(state, batch)
    work = None
    if not state.dry_run:
        with state.real():
            work = ORIGINAL[name](*args, **kwargs)
    if not async_op:
        finish()
        for pending in batch.ops:
            record(state, pending)
        clock.wait_until(op.start + op.cost)
        return work
    end = Once(state, lambda: resolve(state, op))
    clock.defer(end)
    state.tail = op
    return EmulatedWork([work], state, end)


class State:
    """What the wrappers share on one rank: the clock, the cluster, the open batch."""

    def __init__(self, clock, cluster, dry_run: bool = False):
        self.clock, self.cluster, self.dry_run = clock, cluster, dry_run
        self.original = ORIGINAL        # the real functions (the agreement's all-reduce)
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
