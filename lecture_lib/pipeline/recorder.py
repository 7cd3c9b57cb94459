"""What a pipeline step did, recorded only when a caller asks (opt-in measurement).

The executor (:mod:`.execute`) marks each action and each exchange with
:func:`lecture_lib.observe.span` and measures nothing. A :class:`StepRecorder` watches
one step::

    recorder = StepRecorder(activations=True)
    with recorder.watching(executor):
        loss = executor.step(x, y)
    record = recorder.record          # a StepRecord: timeline, waits, activation bytes

* time 0 is the end of a barrier of the pipeline's ranks, so every rank's time 0 is the
  same moment; spans are in real seconds, or in emulated seconds under the emulation
  (:mod:`lecture_lib.emulate`, whose clock every rank shares);
* for each exchange that brought an action its input, when it was posted and when the
  data was there (the message delay, :func:`message_latency`);
* with ``activations=True``, the bytes each forward saves for its backward (a hook on
  every saved tensor, so it costs time: off unless asked for) and the most held at once.

:func:`aligned` and :func:`message_latency` read the records of all ranks.
"""
from __future__ import annotations

import socket
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import observe
from ..metrics import now, time_kind
from .actions import Action, Schedule


@dataclass
class StepRecord:
    """What one rank saw in one step (only ``stage`` and ``loss`` without a recorder)."""
    stage: int
    loss: float | None = None           # the batch's mean loss (last stage), else None
    timeline: list = field(default_factory=list)   # [(kind, start_s, end_s, label), ...]
    peak_activation_bytes: int = 0      # saved-tensor bytes held at once (activations=True)
    activation_bytes: dict = field(default_factory=dict)   # label -> bytes saved by its F
    waits: list = field(default_factory=list)   # [(label, posted_s, received_s)]: its receives
    clock: tuple = ("", 0.0)            # (host, perf_counter at the step's time 0), or
    #                                     ("emulated ...", emulated seconds at time 0)


class StepRecorder:
    """Records one step of one rank at a time (:meth:`watching`, then :attr:`record`)."""

    def __init__(self, activations: bool = False):
        self.activations = activations
        self.record: StepRecord | None = None

    @contextmanager
    def watching(self, executor):
        """Around one ``executor.step``: a barrier of its ranks, then every span it marks."""
        dist.barrier(group=executor.group)
        t0 = now(executor.device, stream_only=True)
        saved: list = []
        with observe.watch() as seen, (saved_tensors(seen, saved) if self.activations
                                       else nullcontext()):
            yield
        spans, kind = seen.spans, time_kind()
        self.record = StepRecord(
            executor.stage,
            timeline=[(sp.name, sp.start - t0, sp.end - t0, str(sp.data["action"]))
                      for sp in spans if sp.name in ("F", "B", "W")],
            waits=[(str(sp.data["action"]), sp.start - t0, sp.end - t0)
                   for sp in spans if sp.name == "exchange" and sp.data["receives"]],
            clock=(socket.gethostname() if kind == "real" else kind, t0))
        if self.activations:
            self.record.activation_bytes, self.record.peak_activation_bytes = \
                activations_held(executor, spans, saved)


@contextmanager
def saved_tensors(seen: observe.Watcher, saved: list):
    """Note in ``saved`` every tensor autograd saves in the block: ``(span, storage, bytes)``,
    ``span`` the index of the span under way (spans are appended as they end)."""
    def pack(t):
        storage = t.untyped_storage()      # keyed by _cdata: a fake tensor's data_ptr() is 0
        saved.append((len(seen.spans), storage._cdata, storage.nbytes()))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def activations_held(executor, spans: list, saved: list) -> tuple[dict, int]:
    """Bytes each forward saved (each storage once, parameters left out), and the most
    held at once: a forward's bytes are freed by its B, or by its W when split."""
    params = {p.untyped_storage()._cdata for c in executor.chunks for p in c.parameters()}
    per_span: dict = {}
    for index, storage, nbytes in saved:
        if storage not in params:
            per_span.setdefault(index, {})[storage] = nbytes
    release = "W" if executor.schedule.split_backward else "B"
    by_label, held, peak = {}, {}, 0
    for index, sp in enumerate(spans):
        a = sp.data.get("action")
        if sp.name == "F":
            held[a] = by_label[str(a)] = sum(per_span.get(index, {}).values())
            peak = max(peak, sum(held.values()))
        elif sp.name == release:
            held.pop(Action("F", a.microbatch, a.chunk), None)
    return by_label, peak


# ----------------------------------------------------------------------------
# Reading the records of every rank
# ----------------------------------------------------------------------------

def _shifts(records: list[StepRecord]) -> list[float]:
    hosts = {rec.clock[0] for rec in records}
    if len(hosts) > 1:
        return [0.0] * len(records)
    t0 = min(rec.clock[1] for rec in records)
    return [rec.clock[1] - t0 for rec in records]


def aligned(records: list[StepRecord]) -> dict:
    """The ranks' timelines of one step on one time axis, ``{rank: spans}``.

    Ranks on one host share ``perf_counter`` (Linux's monotonic clock), so their
    spans are shifted onto the earliest rank's time 0; ranks on several hosts keep
    the barrier at the start of the step as their common time 0. Emulated records
    share the virtual clock (its "host" is the emulation's name).
    """
    return {rank: [(k, a + shift, b + shift, *rest) for k, a, b, *rest in rec.timeline]
            for (rank, rec), shift in zip(enumerate(records), _shifts(records))}


def message_latency(schedule: Schedule, records: list[StepRecord]) -> float:
    """Mean measured delay of a message its receiver was already waiting for: from the
    end of the sending action to the moment the receiver has the data (seconds)."""
    shifts = _shifts(records)
    ends = {(rank, label): end + shift for (rank, rec), shift in zip(enumerate(records), shifts)
            for _, _, end, label in rec.timeline}
    actions = {str(a): a for acts in schedule.actions for a in acts}
    delays = []
    for rank, (rec, shift) in enumerate(zip(records, shifts)):
        for label, posted, got in rec.waits:
            a = actions[label]
            s = schedule.stage(rank, a.chunk)
            src = s - 1 if a.kind == "F" else s + 1
            if not 0 <= src < schedule.num_virtual_stages:
                continue
            sent = ends.get((schedule.rank_of(src), str(type(a)(a.kind, a.microbatch,
                                                                 schedule.chunk_of(src)))))
            if sent is not None and posted + shift <= sent:
                delays.append(got + shift - sent)
    return sum(delays) / len(delays) if delays else 0.0
