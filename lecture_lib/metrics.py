"""Measuring a rank: where its time goes, how many tokens it moves, what it keeps.

* :class:`Timer` splits a rank's wall time into named phases (``"compute"``,
  ``"comm"``, ...) and keeps a timeline of spans for Gantt-style plots. On a
  GPU, work is asynchronous: a host clock read right after launching a kernel
  measures the launch, not the kernel. The timer therefore synchronises the
  device at the edges of every span (``torch.cuda.synchronize``), which is
  the simple, correct choice for teaching (it removes overlap on purpose;
  measure overlap with :func:`wall_time` around the whole step instead).
  Under the emulation (:mod:`lecture_lib.emulate`) the same timer reads the
  rank's virtual *compute stream* instead, as CUDA events recorded on it
  would: spans and totals are emulated seconds, and an asynchronous
  all-reduce still overlaps (a ``comm`` span around ``work.wait()`` is the
  communication left exposed). :func:`wall_time` synchronises both virtual
  streams. ``timer.time_kind`` says which time ("real" or "emulated H100 + NVLink").
* :func:`now` and :func:`time_kind`: the clock every measurement here reads.
* :func:`set_clock_source`: the hook through which a virtual clock reaches the
  timers. This module sits below the emulation and never imports it; the
  emulation registers, when it is imported, a function that returns the rank's
  active virtual clock or ``None`` (:func:`lecture_lib.emulate.current`). A
  clock has ``now()`` (its compute stream, seconds), ``synchronize()`` (waits for
  every stream, returns seconds) and ``label`` (e.g. "H100 + NVLink"). With no
  source, or while it returns ``None``, every measurement is real time.
* :func:`tokens_per_second` and :func:`share`: the derived figures.
* :func:`mfu` of what was measured, with :func:`model_flops_per_token` (``6 N + 12 L T d``;
  :func:`gpt_flops_per_token` for the course's GPT) and :func:`training_days`: the
  formulas live in :mod:`lecture_lib.costmodel.flops`, written once, and are
  re-exported here beside the measurements they turn into MFU.
* :func:`saved_tensor_bytes`: bytes autograd keeps for the backward pass,
  counted with saved-tensor hooks (each storage once).
* :func:`tensor_bytes` and :func:`state_bytes`: bytes of parameters, gradients
  and optimizer state a rank really holds.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from .costmodel.flops import gpt_flops_per_token, mfu, model_flops_per_token, training_days

__all__ = ["Timer", "now", "synchronize", "time_kind", "set_clock_source", "wall_time", "share",
           "tokens_per_second", "mfu", "model_flops_per_token", "gpt_flops_per_token",
           "training_days", "saved_tensor_bytes", "tensor_bytes", "state_bytes"]

_clock_source = None        # set_clock_source: () -> the active virtual clock, or None


def set_clock_source(source):
    """Make ``source()`` (the active virtual clock on this rank, or ``None``) the clock the
    timers read while it returns one; ``None`` removes it. Returns the previous source.
    :mod:`lecture_lib.emulate` registers its own when it is imported."""
    global _clock_source
    if source is not None and not callable(source):
        raise TypeError(f"a clock source is a function or None, not {type(source).__name__}")
    previous, _clock_source = _clock_source, source
    return previous


def _virtual_clock():
    """The virtual clock the registered source reports, or ``None`` (real time)."""
    return _clock_source() if _clock_source is not None else None


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work (no-op on the CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device | str | None = None, stream_only: bool = False) -> float:
    """Seconds on this rank's clock, after synchronising: emulated under the emulation,
    ``time.perf_counter()`` otherwise. Under the emulation ``stream_only=True`` reads
    the compute stream without waiting for the communication stream (a CUDA event)."""
    clock = _virtual_clock()
    if clock is not None:
        return clock.now() if stream_only else clock.synchronize()
    synchronize(device)
    return time.perf_counter()


def time_kind() -> str:
    """``"real"``, or e.g. ``"emulated H100 + NVLink"`` while the emulation is on."""
    clock = _virtual_clock()
    return "real" if clock is None else f"emulated {clock.label}"


class Timer:
    """Per-phase wall-clock totals and a timeline of spans, for one rank.

    >>> timer = Timer()
    >>> with timer("compute"):
    ...     y = x @ w
    >>> timer.totals["compute"], timer.spans   # seconds; [(phase, start, end), ...]
    """

    def __init__(self, device: torch.device | str | None = None):
        self.device = device
        self.totals: dict[str, float] = defaultdict(float)
        self.spans: list[tuple[str, float, float]] = []
        self.reset()

    def _t0(self) -> float:
        return self.t0 if _virtual_clock() is None else self.t0_emulated

    @contextmanager
    def __call__(self, phase: str):
        self.time_kind = time_kind()
        start = now(self.device, stream_only=True)
        try:
            yield
        finally:
            end = now(self.device, stream_only=True)
            self.totals[phase] += end - start
            self.spans.append((phase, start - self._t0(), end - self._t0()))

    def now(self) -> float:
        """Seconds since :meth:`reset` on the clock the spans use (under the emulation
        the compute stream, as a CUDA event would read it)."""
        return now(self.device, stream_only=True) - self._t0()

    def reset(self) -> None:
        self.totals.clear()
        self.spans.clear()
        clock = _virtual_clock()
        self.t0 = time.perf_counter()
        self.t0_emulated = clock.now() if clock is not None else 0.0
        self.time_kind = time_kind()

    def share(self, phase: str) -> float:
        """Fraction of the timed total spent in ``phase``."""
        return share(self.totals, phase)

    def summary(self) -> dict:
        return {"totals": dict(self.totals), "spans": list(self.spans)}


def share(totals: dict[str, float], phase: str) -> float:
    total = sum(totals.values())
    return totals.get(phase, 0.0) / total if total > 0 else 0.0


@contextmanager
def wall_time(device: torch.device | str | None = None):
    """``with wall_time() as t: ...`` then ``t.seconds``; synchronises a GPU at both ends.

    Under the emulation ``t.seconds`` is emulated time (``t.time_kind`` says so).
    """
    class _Result:
        seconds = 0.0
        time_kind = "real"
    result = _Result()
    result.time_kind = time_kind()
    start = now(device)
    try:
        yield result
    finally:
        result.seconds = now(device) - start


def tokens_per_second(tokens: int, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    return tokens / seconds


@contextmanager
def saved_tensor_bytes():
    """Count the bytes autograd saves for backward inside the block.

    >>> with saved_tensor_bytes() as saved:
    ...     loss = model(x, y)
    >>> saved.bytes
    Each storage counts once (a tensor saved twice, or two views of one
    storage, are one allocation); parameters are included, as autograd saves
    them too: subtract :func:`tensor_bytes` of the parameters to get
    activations alone, or use ``saved.activation_bytes(model)``.
    """
    class _Counter:
        def __init__(self):
            self.bytes, self._seen = 0, set()

        def activation_bytes(self, module: torch.nn.Module) -> int:
            """Saved bytes less the module's parameters (which autograd saves too)."""
            return self.bytes - sum(p.untyped_storage().nbytes() for p in module.parameters()
                                    if p.untyped_storage()._cdata in self._seen)

    counter = _Counter()

    def pack(t):
        storage = t.untyped_storage()     # one storage, one allocation: keyed by its identity,
        if storage._cdata not in counter._seen:       # not its address (a fake tensor's is 0)
            counter._seen.add(storage._cdata)
            counter.bytes += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield counter


def tensor_bytes(tensors) -> int:
    """Bytes of the given tensors (``None`` entries count 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Bytes this rank holds in parameters, gradients and optimizer state."""
    params = list(model.parameters())
    opt = 0
    if optimizer is not None:
        opt = tensor_bytes(v for s in optimizer.state.values() for v in s.values()
                           if isinstance(v, torch.Tensor))
    return {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
            "optimizer": opt}
