"""Communication in virtual time: real collectives, charged by the alpha-beta cost of their size.

While the emulation is on, this rank's ``torch.distributed`` functions are
wrapped (and restored on exit). A wrapped collective runs the real operation
on the real tensors, and charges the rank's communication stream with the
ring algorithm's alpha-beta cost for the buffer's real size ``n`` on ``p``
ranks (Thakur, Rabenseifner & Gropp 2005; Hockney 1994):

    all-reduce               2 (p-1) alpha + 2 (p-1)/p * n / beta
    all-gather / reduce-scatter  (p-1) alpha +   (p-1)/p * n / beta   (n: the full buffer)
    all-to-all                 (p-1) alpha + (bytes this rank sends to others) / beta
    broadcast / reduce         (p-1) alpha + n / beta                 (pipelined ring)
    barrier                  2 (p-1) alpha
    send / recv                      alpha + n / beta

The link is chosen by topology: a group whose ranks share a node rides
NVLink, one that spans nodes is as slow as its slowest hop, InfiniBand
(:meth:`.Cluster.link`). These formulas are written here on purpose, apart
from :mod:`lecture_lib.costmodel`: the cost model predicts a whole step in
closed form, the emulation charges each operation as it happens, and their
agreement is evidence only if neither calls the other.

A collective starts when every participant has issued it and its stream is
free: each rank's ``max(compute, comm)`` is combined with an extra tiny
all-reduce (MAX, float64), issued with the real, unwrapped function just
before the data. ``async_op=True`` returns an :class:`EmulatedWork`; its
``wait()`` makes the compute stream wait for the collective's end, so an
asynchronous collective overlaps with the compute issued after it. Point to
point messages are in :mod:`.p2p`.
"""
from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .nccl import collective_seconds, p2p_seconds  # noqa: F401  (re-exported)

COLLECTIVES = ["all_reduce", "all_gather_single", "all_gather_into_tensor",
               "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all_single",
               "all_to_all", "all_gather", "reduce_scatter", "broadcast", "reduce", "barrier"]
P2P = ["send", "recv", "isend", "irecv", "batch_isend_irecv"]
ORIGINAL = {name: getattr(c10d, name) for name in COLLECTIVES + P2P if hasattr(c10d, name)}
SIGNATURE = {name: inspect.signature(f) for name, f in ORIGINAL.items()}
_KIND = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
         "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
         "all_to_all_single": "all_to_all"}


def nbytes_of(t) -> int:
    if isinstance(t, (list, tuple)):
        return sum(nbytes_of(x) for x in t)
    return t.numel() * t.element_size()


class State:
    """What the wrappers share on one rank: the clock, the cluster, and a re-entry guard."""

    def __init__(self, clock, cluster):
        self.clock, self.cluster = clock, cluster
        self.depth = 0                  # > 0 inside a wrapper: nested calls pass through
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self._ranks: dict = {}

    def charging(self) -> bool:
        return self.depth == 0

    @contextmanager
    def quiet(self):
        """Bookkeeping that must charge nothing and wrap nothing."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def ranks(self, group) -> list[int]:
        key = "world" if group is None else group
        if key not in self._ranks:
            self._ranks[key] = dist.get_process_group_ranks(group or dist.group.WORLD)
        return self._ranks[key]


class EmulatedWork:
    """A real ``Work`` whose ``wait()`` also makes the compute stream wait for its end."""

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


def _size(name: str, a: dict, me: int) -> int:
    if name == "all_reduce" or name in ("broadcast", "reduce"):
        return nbytes_of(a["tensor"])
    if name in ("all_gather_single", "all_gather_into_tensor"):
        return nbytes_of(a["output_tensor"])
    if name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        return nbytes_of(a["input"])
    if name == "all_gather":
        return nbytes_of(a["tensor_list"])
    if name == "reduce_scatter":
        return nbytes_of(a["input_list"])
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
    bound = SIGNATURE[name].bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    group, async_op = a.get("group"), bool(a.get("async_op", False))
    ranks = state.ranks(group)
    if state.rank not in ranks:
        return ORIGINAL[name](*args, **kwargs)
    a["_ranks"] = ranks
    clock, p = state.clock, len(ranks)
    kind = _KIND.get(name, name)
    nbytes = _size(name, a, ranks.index(state.rank))
    clock.resolve()                        # the previous collectives' ends fix this start
    clock.issued.append((kind, clock.compute, nbytes))
    local = max(clock.compute, clock.comm)
    cost = state.cluster.collective_seconds(kind, nbytes, ranks)
    agree = None
    if p > 1:
        agree = torch.tensor([local], dtype=torch.float64)
        agree_work = ORIGINAL["all_reduce"](agree, op=dist.ReduceOp.MAX, group=group,
                                            async_op=True)
    work = ORIGINAL[name](*args, **kwargs)

    def finish():
        start = local
        if agree is not None:
            agree_work.wait()
            start = float(agree.item())
        clock.comm_span(kind, start, start + cost, nbytes)
        return start + cost

    end = Once(state, finish)
    if not async_op:
        clock.wait_until(end())
        return work
    clock.defer(end)
    return EmulatedWork([work], state, end)


def wrap(state: State, name: str, body):
    """The function installed for ``name``: emulated at depth 0, the original inside."""
    original = ORIGINAL[name]

    def wrapper(*args, **kwargs):
        if state.depth > 0:
            return original(*args, **kwargs)
        state.depth += 1
        try:
            return body(state, name, args, kwargs)
        finally:
            state.depth -= 1

    wrapper.__name__ = wrapper.__qualname__ = original.__name__
    wrapper.__doc__ = original.__doc__
    wrapper.__wrapped__ = original
    return wrapper


def _homes() -> list:
    """Modules that may hold their own reference to a torch.distributed function."""
    keep = ("lecture_lib", "solutions", "exercises", "examples", "__main__")
    return [m for name, m in list(sys.modules.items())
            if m is not None and name.split(".")[0] in keep]


def install(wrappers: dict) -> list:
    """Replace the functions in torch.distributed and in the course's modules; return undo."""
    undo = []
    by_id = {id(f): name for name, f in ORIGINAL.items()}
    for module in [dist, c10d] + _homes():
        for attr, value in list(vars(module).items()):
            name = by_id.get(id(value))
            if name is not None and name in wrappers:
                undo.append((module, attr, value))
                setattr(module, attr, wrappers[name])
    return undo


def uninstall(undo: list) -> None:
    for module, attr, value in reversed(undo):
        setattr(module, attr, value)
