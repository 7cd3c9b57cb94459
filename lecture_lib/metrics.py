"""Measuring a rank: where its time goes, how many tokens it moves, what it keeps.

* :class:`Timer` splits a rank's wall time into named phases (``"compute"``,
  ``"comm"``, ...) and keeps a timeline of spans for Gantt-style plots. On a
  GPU, work is asynchronous: a host clock read right after launching a kernel
  measures the launch, not the kernel. The timer therefore synchronises the
  device at the edges of every span (``torch.cuda.synchronize``), which is
  the simple, correct choice for teaching (it removes overlap on purpose;
  measure overlap with :func:`wall_time` around the whole step instead).
* :func:`tokens_per_second` and :func:`share`: the derived figures.
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


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work (no-op on the CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


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
        self.t0 = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str):
        synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            end = time.perf_counter()
            self.totals[phase] += end - start
            self.spans.append((phase, start - self.t0, end - self.t0))

    def reset(self) -> None:
        self.totals.clear()
        self.spans.clear()
        self.t0 = time.perf_counter()

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
    """``with wall_time() as t: ...`` then ``t.seconds``; synchronises a GPU at both ends."""
    class _Result:
        seconds = 0.0
    result = _Result()
    synchronize(device)
    start = time.perf_counter()
    try:
        yield result
    finally:
        synchronize(device)
        result.seconds = time.perf_counter() - start


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
                                    if p.untyped_storage().data_ptr() in self._seen)

    counter = _Counter()

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in counter._seen:
            counter._seen.add(storage.data_ptr())
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
