"""Virtual time of one rank: a compute stream and a communication stream.

A GPU runs kernels on streams: the host enqueues work and returns at once,
kernels on one stream run in order, and two streams run at the same time. A
rank's :class:`Clock` keeps two such timelines, in seconds of emulated time:

* ``compute``: when the compute stream will have finished everything enqueued
  on it; every operation is charged here (:mod:`.compute`).
* ``comm``: the same for the communication stream (NCCL runs collectives on a
  stream of their own); every collective and send is charged here
  (:mod:`.comm`). An operation issued asynchronously starts when both the
  data is ready (``compute`` at issue) and the stream is free (``comm``).

``wait_until(t)`` makes the compute stream wait for an event at ``t``, as
``work.wait()`` does on a GPU (a CUDA stream waiting on an event). ``now()``
is when this rank's compute stream is done so far; ``synchronize()`` waits
for both streams (``torch.cuda.synchronize``). ``spans`` is the timeline,
``[(kind, start, end, text), ...]``, with adjacent compute of one kind merged;
``host`` is when the host (Python, eager PyTorch) has launched everything so
far: a kernel cannot start before it is launched (:meth:`launch`), so a rank
whose kernels are shorter than their launches is launch-bound. The spans count
such a wait in the kernel's kind; ``launch_waits`` lists each wait, ``(start,
end)``, and ``launches`` counts the kernels, so a trace can show the waits as
the gaps a GPU trace has between kernels. ``seconds_by_op`` adds each kernel's
seconds (its launch wait not included) under the name of its operation, what a
GPU profiler's table of kernels by name shows.
``issued`` lists each collective as ``(kind, compute time at issue, bytes)``: when
its data was ready (its span starts later when the stream was still busy).

Times depend only on what the program does (shapes, sizes, the order of
operations), never on a real clock, so they are the same on a busy and an
idle machine.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

_ACTIVE: list = []          # the clock of the emulation running on this rank, if any


def current():
    """The active :class:`Clock` on this rank, or ``None`` when emulation is off."""
    return _ACTIVE[-1] if _ACTIVE else None


@dataclass
class Clock:
    """Per-rank virtual clocks (seconds), busy totals and the timeline of spans."""
    label: str = ""
    compute: float = 0.0
    comm: float = 0.0
    host: float = 0.0                   # when the host has launched everything so far
    spans: list = field(default_factory=list)
    totals: dict = field(default_factory=dict)
    flops: float = 0.0                  # counted FLOPs charged so far
    comm_bytes: float = 0.0             # bytes of the buffers of the collectives/messages
    bytes_by_kind: dict = field(default_factory=dict)   # {"all_gather": bytes, "send": ...}
    calls_by_kind: dict = field(default_factory=dict)
    issued: list = field(default_factory=list)          # (kind, compute time, bytes) per call
    kind: str = "compute"               # the kind new compute is charged as
    launches: int = 0                   # kernels launched so far
    launch_waits: list = field(default_factory=list)    # (start, end): stream waits for the host
    seconds_by_op: dict = field(default_factory=dict)   # {"mm": seconds, ...}: kernels by name
    _pending: list = field(default_factory=list, repr=False)   # resolvers of async clocks

    # -- reading -------------------------------------------------------------
    def now(self) -> float:
        """Emulated seconds at which this rank's compute stream is done so far
        (what a CUDA event recorded on it now would read; pending collectives do
        not move it until something waits for them)."""
        return self.compute

    def synchronize(self) -> float:
        """Wait for both streams (``torch.cuda.synchronize``); returns the time."""
        self.resolve()
        self.compute = max(self.compute, self.comm)
        self.host = max(self.host, self.compute)
        return self.compute

    def catch_up(self) -> None:
        """The host waits for the compute stream (a ``.item()``, a copy to the CPU)."""
        self.host = max(self.host, self.compute)

    def timeline(self) -> dict:
        """``{"compute": [...], "comm": [...]}``: the spans of each stream."""
        self.resolve()
        out = {"compute": [], "comm": []}
        for span in self.spans:
            out["comm" if span[0] == "comm" else "compute"].append(span)
        return out

    def summary(self) -> dict:
        self.resolve()
        return {"now": self.compute, "comm_end": self.comm, "totals": dict(self.totals),
                "flops": self.flops, "comm_bytes": self.comm_bytes,
                "bytes_by_kind": dict(self.bytes_by_kind),
                "calls_by_kind": dict(self.calls_by_kind),
                "spans": list(self.spans)}

    # -- labelling -----------------------------------------------------------
    @contextmanager
    def phase(self, kind: str):
        """``with clock.phase("backward"):`` charges the block's compute as ``kind``."""
        before, self.kind = self.kind, kind
        try:
            yield self
        finally:
            self.kind = before

    # -- charging (used by the emulation's compute mode and communication) ---
    def charge(self, seconds: float, flops: float = 0.0) -> None:
        """Run ``seconds`` of work on the compute stream."""
        start = self.compute
        self.compute = start + seconds
        self.flops += flops
        self._add(self.kind, seconds)
        last = self.spans[-1] if self.spans else None
        if last is not None and last[0] == self.kind and last[2] == start:
            self.spans[-1] = (last[0], last[1], self.compute, last[3])
        elif seconds > 0:
            self.spans.append((self.kind, start, self.compute, ""))

    def launch(self, seconds: float, host_seconds: float, flops: float = 0.0,
               op: str = "") -> None:
        """One kernel of operation ``op``: the host spends ``host_seconds`` launching it, then
        it runs ``seconds`` on the compute stream, starting when both the stream and the
        launch are done (a stream that waited for the host counts the wait in the current
        kind)."""
        self.host += host_seconds
        self.launches += 1
        self.seconds_by_op[op] = self.seconds_by_op.get(op, 0.0) + seconds
        waited = self.host - self.compute
        if waited > 0:
            self.launch_waits.append((self.compute, self.host))
        self.charge(seconds + waited if waited > 0 else seconds, flops)

    def comm_span(self, text: str, start: float, end: float, nbytes: float,
                  occupy: bool = True, kind: str | None = None) -> None:
        """Record a transfer ``start..end`` of a buffer of ``nbytes`` (the full buffer of a
        collective, as :mod:`lecture_lib.comm` counts it); ``occupy`` moves the comm
        stream to ``end``; ``kind`` (default ``text``) keys ``bytes_by_kind``."""
        if occupy:
            self.comm = max(self.comm, end)
        kind = kind or text
        self.bytes_by_kind[kind] = self.bytes_by_kind.get(kind, 0) + nbytes
        self.calls_by_kind[kind] = self.calls_by_kind.get(kind, 0) + 1
        self.comm_bytes += nbytes
        self._add("comm", end - start)
        self.spans.append(("comm", start, end, text))

    def _add(self, kind: str, seconds: float) -> None:
        self.totals[kind] = self.totals.get(kind, 0.0) + seconds

    def wait_until(self, t: float) -> None:
        """The compute stream waits for an event at ``t``."""
        if t > self.compute:
            self.spans.append(("idle", self.compute, t, ""))
            self._add("idle", t - self.compute)
            self.compute = t

    def defer(self, resolver) -> None:
        """Register a function that completes an asynchronous op's accounting."""
        self._pending.append(resolver)

    def resolve(self) -> None:
        """Finish the accounting of asynchronous ops issued so far (in issue order)."""
        while self._pending:
            self._pending.pop(0)()
