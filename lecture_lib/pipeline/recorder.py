"""What a pipeline step did, recorded only when a caller asks (opt-in measurement).

:class:`~.execute.PipelineExecutor` runs a schedule and measures nothing. Pass
it a :class:`StepRecorder` (``executor.step(x, y, recorder=StepRecorder())``)
and the recorder

* starts the step's clock at a barrier of the pipeline's ranks, so every
  rank's time 0 is the same moment;
* times every action (``metrics.Timer``, which synchronises a GPU) into a
  timeline ``[(kind, start_s, end_s, label), ...]``; under the emulation
  (:mod:`lecture_lib.emulate`) the timer reads the rank's virtual compute
  stream, so the same record is in emulated seconds (``StepRecord.clock``
  then names the emulated clock, which every rank shares);
* notes, for every action that waits for a message, when it posted the
  receive and when the data was there (the message delay, see
  :func:`message_latency`);
* with ``activations=True`` counts the bytes each forward saves for its
  backward (``metrics.saved_tensor_bytes``, a Python hook on every saved
  tensor, so it costs time: that is why it is off unless asked for) and the
  most held at once.

:func:`aligned` and :func:`message_latency` read the records of all ranks.
"""
from __future__ import annotations

import socket
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch.distributed as dist

from ..metrics import Timer, saved_tensor_bytes
from ..runtime import launch
from .actions import Schedule


@dataclass
class StepRecord:
    """What one rank saw in one step (only ``stage`` and ``loss`` without a recorder)."""
    stage: int
    loss: float | None                  # the batch's mean loss (last stage), else None
    timeline: list = field(default_factory=list)   # [(kind, start_s, end_s, label), ...]
    peak_activation_bytes: int = 0      # saved-tensor bytes held at once (activations=True)
    activation_bytes: dict = field(default_factory=dict)   # label -> bytes saved by its F
    waits: list = field(default_factory=list)   # [(label, posted_s, received_s)]: its receives
    clock: tuple = ("", 0.0)            # (host, perf_counter at the step's time 0), or
    #                                     ("emulated ...", emulated seconds at time 0)


class StepRecorder:
    """Records one step of one rank; use a fresh one (or call :meth:`start`) per step."""

    def __init__(self, activations: bool = False, device=None):
        self.activations = activations
        self.timer = Timer(launch.device() if device is None else device)
        self.labels, self.waits, self.saved, self.held = [], [], {}, {}
        self.peak, self.release = 0, "B"

    def start(self, schedule: Schedule, group=None) -> None:
        """A barrier of the pipeline's ranks, then the clock starts (time 0)."""
        self.release = "W" if schedule.split_backward else "B"
        self.labels, self.waits, self.saved, self.held, self.peak = [], [], {}, {}, 0
        dist.barrier(group=group)
        self.timer.reset()

    @contextmanager
    def receiving(self, action):
        """Around the exchange that brings ``action`` its input."""
        posted = self.timer.now()
        yield
        self.waits.append((str(action), posted, self.timer.now()))

    @contextmanager
    def action(self, action, chunk):
        """Around one action's compute: its span, and the bytes a forward saves."""
        key = (action.microbatch, action.chunk)
        with self.timer(action.kind):
            if self.activations and action.kind == "F":
                with saved_tensor_bytes() as counter:
                    yield
                self.held[key] = self.saved[str(action)] = counter.activation_bytes(chunk)
                self.peak = max(self.peak, sum(self.held.values()))
            else:
                yield
        if action.kind == self.release:
            self.held.pop(key, None)
        self.labels.append(str(action))

    def record(self, stage: int, loss: float | None) -> StepRecord:
        timeline = [(k, start, end, label)
                    for (k, start, end), label in zip(self.timer.spans, self.labels)]
        origin = ((socket.gethostname(), self.timer.t0) if self.timer.time_kind == "real"
                  else (self.timer.time_kind, self.timer.t0_emulated))
        return StepRecord(stage, loss, timeline, self.peak, dict(self.saved), list(self.waits),
                          origin)


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
