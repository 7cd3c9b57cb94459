"""Watching an algorithm run: the one hook that experiments, profilers and tests use.

An algorithm says what it is doing and never measures it::

    with observe.span("dispatch"):                  # a phase of its step
        ...
    observe.note("routing", tokens_per_expert=n)    # a fact someone may want

Nobody watching, both cost one check of an empty list: no clock is read, no device is
synchronised. A caller turns watching on for a block, on one rank::

    with observe.watch() as seen:
        layer(x)
    seen.totals()                # {"dispatch": seconds, ...}
    seen.notes("routing")        # [{"tokens_per_expert": ...}, ...]

Spans are timed on :func:`lecture_lib.metrics.now`: real seconds, or the emulated clock's
while the emulation is on. Every collective of the course is a span too, of kind
``"comm"`` (:func:`lecture_lib.comm.collective`): :func:`lecture_lib.comm.record_comm` is
one view of what a watcher saw.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from .metrics import now, time_kind


@dataclass
class Span:
    """One watched stretch of work: its name, start and end seconds, and what the algorithm
    said of it (``kind="comm"``, ``nbytes``, ...)."""
    name: str
    start: float
    end: float
    data: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Watcher:
    """What one :func:`watch` block saw: spans in the order they ended, and notes."""
    spans: list[Span] = field(default_factory=list)
    facts: list[tuple[str, dict]] = field(default_factory=list)

    def select(self, name: str | None = None, **data) -> list[Span]:
        """The spans of this ``name`` (None: any) whose data has every given value."""
        return [s for s in self.spans if (name is None or s.name == name)
                and all(s.data.get(k) == v for k, v in data.items())]

    def totals(self, **data) -> dict[str, float]:
        """Seconds per span name (of the spans whose data match)."""
        out: dict[str, float] = {}
        for s in self.select(**data):
            out[s.name] = out.get(s.name, 0.0) + s.seconds
        return out

    def notes(self, name: str) -> list[dict]:
        """Everything noted under ``name``, in order."""
        return [data for n, data in self.facts if n == name]


_WATCHERS: list[Watcher] = []


def watching() -> bool:
    """Is anybody watching on this rank? (An algorithm may skip bookkeeping when not.)"""
    return bool(_WATCHERS)


@contextmanager
def watch(watcher: Watcher | None = None):
    """Watch the block: every span and note on this rank goes to the yielded watcher."""
    watcher = Watcher() if watcher is None else watcher
    _WATCHERS.append(watcher)
    try:
        yield watcher
    finally:
        _WATCHERS.remove(watcher)


@contextmanager
def span(name: str, device=None, synchronize: bool = False, **data):
    """Mark the block as ``name`` for whoever watches (else do nothing). ``synchronize``:
    wait for queued device work at both ends (a collective's real duration on a GPU);
    otherwise, and always under the emulation, read the compute stream as it stands."""
    if not _WATCHERS:
        yield
        return
    # Under the emulation a watcher only reads the clock: synchronising it would make the
    # compute stream wait for the collective (changing the step it watches) and would ask
    # the other ranks to agree on times (a watch on one rank would hang).
    stream_only = not synchronize or time_kind() != "real"
    start = now(device, stream_only=stream_only)
    try:
        yield
    finally:
        end = now(device, stream_only=stream_only)
        for watcher in _WATCHERS:
            watcher.spans.append(Span(name, start, end, data))


def note(name: str, **data) -> None:
    """Tell whoever watches a fact (else do nothing)."""
    for watcher in _WATCHERS:
        watcher.facts.append((name, data))
