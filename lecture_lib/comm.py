"""The communication mechanics every scheme shares, written once.

Every parallel scheme of the course talks through a handful of moves: find
out who I am in a group, all-reduce a list of gradients through one flat
buffer, all-gather or reduce-scatter one tensor into another, and (when a
notebook asks) record how many bytes each collective moved and how long it
took. They live here so that data parallelism, ZeRO, tensor, pipeline and
expert parallelism, profiling and debugging all do them the same way.

Measurement is opt-in. Each collective is a ``"comm"`` span of
:mod:`lecture_lib.observe`; :func:`record_comm` watches the block and reads them as a
:class:`CommLog`. Nobody watching, :func:`collective` runs the operation and nothing else
(no clock read, no device synchronisation), so an algorithm costs the same whether or not
anybody could measure it.

>>> with record_comm() as log:                 # inside a rank function
...     all_reduce_flat([p.grad for p in model.parameters()], average=True)
>>> log.calls(), log.buffer_bytes()            # 1 call, sum of the gradients' bytes
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import observe
from .costmodel.comm import bus_factor

# torch 2.13 renamed the tensor-in/tensor-out collectives; older torch has the old names only.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

LOCAL = "local"
"""``group=LOCAL``: one process, no communication (the reference of a scheme)."""


# ----------------------------------------------------------------------------
# Who am I in this group
# ----------------------------------------------------------------------------

def group_info(group=None, *, required: bool = False) -> tuple[int, int]:
    """``(rank, size)`` of this process in ``group`` (``None``: the world).

    Without an initialised process group, or with ``group=LOCAL``, this is one
    process: ``(0, 1)``; ``required=True`` raises instead, for schemes that
    make no sense on one process.
    """
    if group == LOCAL:
        return 0, 1
    if not dist.is_initialized():
        if required:
            raise RuntimeError("no process group: this needs an initialised process group "
                               "(run it under lecture_lib.run or torchrun)")
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def resolve(group):
    """``(group or None, rank, size)``: ``LOCAL`` becomes ``None`` with one rank."""
    rank, size = group_info(group)
    return (None if group == LOCAL else group), rank, size


# ----------------------------------------------------------------------------
# Recording (off unless a caller turns it on): one view of lecture_lib.observe
# ----------------------------------------------------------------------------

@dataclass
class CommRecord:
    """One recorded call: its kind, the caller's ``phase`` label, the buffer's bytes (the
    full, unsharded buffer: for a reduce-scatter its input, for an all-gather its output), the
    number of ranks in the group, and the seconds it took (real, or emulated)."""
    kind: str            # "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", ...
    phase: str           # whatever the caller names it: "forward", "backward", "grads", ...
    nbytes: int          # costmodel.comm's convention: the full (unsharded) buffer
    group_size: int
    seconds: float


@dataclass
class CommLog:
    """Every collective run through :func:`collective` while :func:`record_comm` watched."""
    watcher: observe.Watcher = field(default_factory=observe.Watcher)

    @property
    def records(self) -> list[CommRecord]:
        return [CommRecord(s.data["kind"], s.data["phase"], s.data["nbytes"],
                           s.data["group_size"], s.seconds) for s in self.watcher.select("comm")]

    def select(self, phase=None, kind=None) -> list[CommRecord]:
        """The records of this ``phase`` label and ``kind`` (None: any)."""
        return [r for r in self.records if (phase is None or r.phase == phase)
                and (kind is None or r.kind == kind)]

    def calls(self, phase=None, kind=None) -> int:
        """How many calls (of this phase and kind; None: any)."""
        return len(self.select(phase, kind))

    def buffer_bytes(self, phase=None, kind=None) -> int:
        """Bytes of the buffers those calls worked on (each the full buffer; see
        :class:`CommRecord`)."""
        return sum(r.nbytes for r in self.select(phase, kind))

    def sent_bytes(self, phase=None, kind=None) -> float:
        """Bytes one rank sends with ring collectives (``bus_factor`` x buffer)."""
        return sum(r.nbytes * bus_factor(r.kind, r.group_size)
                   for r in self.select(phase, kind))

    def seconds(self, phase=None, kind=None) -> float:
        """Seconds those calls took on this rank."""
        return sum(r.seconds for r in self.select(phase, kind))

    def summary(self) -> dict:
        """``{phase: {kind: (calls, buffer bytes)}}``."""
        out: dict = {}
        for r in self.records:
            calls, nbytes = out.setdefault(r.phase, {}).get(r.kind, (0, 0))
            out[r.phase][r.kind] = (calls + 1, nbytes + r.nbytes)
        return out


@contextmanager
def record_comm():
    """``with record_comm() as log: ...`` records every collective on this rank."""
    with observe.watch() as watcher:
        yield CommLog(watcher)


def recording() -> bool:
    """Is anybody watching? Algorithms use it to skip bookkeeping when nobody measures."""
    return observe.watching()


def collective(kind: str, nbytes: int, group_size: int, phase: str = "",
               device: torch.device | str | None = None):
    """Wrap one communication call: a ``"comm"`` span (:mod:`lecture_lib.observe`), timed
    with the device synchronised at both ends, and only while somebody watches.

    ``nbytes`` follows ``costmodel.comm``: the full buffer (for a reduce-scatter
    the input, for an all-gather the output).
    """
    return observe.span("comm", device, synchronize=True, kind=kind, phase=phase,
                        nbytes=int(nbytes), group_size=group_size)


def maybe(ctx):
    """``with maybe(timer("comm") if timer else None):``: a context or nothing."""
    return nullcontext() if ctx is None else ctx


# ----------------------------------------------------------------------------
# The moves
# ----------------------------------------------------------------------------

def all_reduce_flat(tensors, group=None, *, average: bool = False, phase: str = "grads",
                    async_op: bool = False):
    """All-reduce a list of tensors through one flat buffer and copy the result back.

    The move DDP, ZeRO-1's gradient sync, expert parallelism's replicated
    weights and the debugging tools share: ``torch.cat`` the tensors, one
    all-reduce (summed, or averaged with ``average=True``), then copy each
    slice back in place. ``None`` entries are skipped. With ``async_op=True``
    it returns a function that waits and copies back.
    """
    tensors = [t for t in tensors if t is not None]
    group, _, size = resolve(group)
    if not tensors or size == 1:
        return (lambda: None) if async_op else None
    flat = torch.cat([t.reshape(-1) for t in tensors])
    if average:
        flat.div_(size)
    nbytes = flat.numel() * flat.element_size()
    with collective("all_reduce", nbytes, size, phase, flat.device):
        work = dist.all_reduce(flat, group=group, async_op=async_op)

    def finish():
        if work is not None:
            work.wait()
        for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.copy_(part.view_as(t))

    if async_op:
        return finish
    finish()
    return None


def all_gather_into(out: torch.Tensor, mine: torch.Tensor, group=None, phase: str = "",
                    async_op: bool = False):
    """``out`` (``size * mine.numel()`` elements, 1-D) gets every rank's ``mine``, in rank
    order: rank r's elements at ``out[r * mine.numel():(r + 1) * mine.numel()]``. Same dtype on
    both; ``mine`` has the same number of elements on every rank.

    ``phase`` is only a label: a recorder (:func:`record_comm`) files the call under it
    (:attr:`CommRecord.phase`, e.g. ``"gather"``); it changes nothing that is sent. Recorded as
    kind ``"all_gather"`` with ``out``'s bytes. ``async_op=True`` returns the request to
    ``wait()`` on (else None, and ``out`` is filled on return)."""
    group, _, size = resolve(group)
    with collective("all_gather", out.numel() * out.element_size(), size, phase, out.device):
        return all_gather_single(out, mine, group=group, async_op=async_op)


def reduce_scatter_into(out: torch.Tensor, full: torch.Tensor, group=None, phase: str = "",
                        op=dist.ReduceOp.SUM, async_op: bool = False):
    """``out`` (``full.numel() / size`` elements) gets this rank's chunk of the element-wise
    sum over ranks of ``full``: rank r gets elements ``[r * out.numel(), (r + 1) *
    out.numel())`` of the sum (``op``: SUM by default). ``full.numel()`` must be a multiple of
    the group size; same dtype on both.

    ``phase`` is only a label: a recorder (:func:`record_comm`) files the call under it
    (:attr:`CommRecord.phase`, e.g. ``"grads"``); it changes nothing that is sent. Recorded as
    kind ``"reduce_scatter"`` with ``full``'s bytes. ``async_op=True`` returns the request to
    ``wait()`` on."""
    group, _, size = resolve(group)
    with collective("reduce_scatter", full.numel() * full.element_size(), size, phase,
                    full.device):
        return reduce_scatter_single(out, full, op=op, group=group, async_op=async_op)
