"""What an exercise test's own rank functions use to look at a submission, and to say what
is wrong: every call the process groups ran (:func:`record_dist`), and one message per rank
that differs (:func:`assert_close_per_rank`, :func:`difference`)."""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

#: The process group's methods that every ``torch.distributed`` call ends in, by kind.
_PG_KINDS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "allgather": "all_gather",
    "_allgather_base": "all_gather", "all_gather_single": "all_gather",
    "allgather_coalesced": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "alltoall": "all_to_all",
    "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all", "broadcast": "broadcast",
    "reduce": "reduce", "gather": "gather", "scatter": "scatter", "send": "send", "recv": "recv",
    "recv_anysource": "recv", "barrier": "barrier"}


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class _WaitProbe:
    """A request whose ``wait`` is recorded (everything else is the request's)."""

    def __init__(self, work, events: list, kind: str):
        self._work, self._events, self._kind = work, events, kind

    def wait(self, *args, **kwargs):
        self._events.append({"kind": "wait", "of": self._kind})
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


@contextmanager
def record_dist(waits: bool = False):
    """On a rank (inside a test's rank function): every call this rank's process groups
    run, in order, as dicts ``{"kind": "all_to_all", "bytes": buffer bytes (the first
    argument: the output, or the message), "input": bytes of the second argument's tensors,
    "dtypes": [...], "peer": group rank of a send/recv, "root": a broadcast's}``; with
    ``waits``, also ``{"kind": "wait", "of": kind}`` when a request is waited on. Sees every
    ``torch.distributed`` call however the submission imported it; restores the methods."""
    events: list = []
    group_class = dist.ProcessGroup
    saved = {m: vars(group_class)[m] if m in vars(group_class) else getattr(group_class, m)
             for m in _PG_KINDS if hasattr(group_class, m)}

    def probe(method, kind, original):
        def recording(self, *args, **kwargs):
            first = _tensors(args[0]) if args else []
            second = _tensors(args[1]) if len(args) > 1 else []
            event = {"kind": kind, "method": method,
                     "bytes": sum(t.numel() * t.element_size() for t in first),
                     "input": sum(t.numel() * t.element_size() for t in second),
                     "dtypes": sorted({str(t.dtype) for t in first + second})}
            if kind in ("send", "recv") and len(args) > 1 and isinstance(args[1], int):
                event["peer"] = args[1]
            if len(args) > 1 and hasattr(args[1], "rootRank"):
                event["root"] = args[1].rootRank
            events.append(event)
            work = original(self, *args, **kwargs)
            return _WaitProbe(work, events, kind) if waits and work is not None else work
        return recording

    try:
        for method, original in saved.items():
            setattr(group_class, method, probe(method, _PG_KINDS[method], original))
        yield events
    finally:
        for method, original in saved.items():
            setattr(group_class, method, original)


def assert_close_per_rank(got: list, expected, what: str = "the result", **tolerance) -> None:
    """Every rank's ``got[rank]`` equals ``expected`` (one value, or a list by rank), within
    ``torch.testing.assert_close``'s tolerance; else one message naming, for each rank that
    differs, what was expected and what came back."""
    wanted = expected if isinstance(expected, list) else [expected] * len(got)
    wrong = []
    for rank, (g, e) in enumerate(zip(got, wanted)):
        try:
            torch.testing.assert_close(g, e, **tolerance)
        except (AssertionError, TypeError) as exc:
            wrong.append(f"rank {rank}: {difference(g, e, exc, **tolerance)}")
    if wrong:
        raise AssertionError(f"{what} is wrong on {len(wrong)} of {len(got)} ranks: "
                             + "\n".join(wrong))


def difference(got, want, exc: Exception | None = None, rtol: float | None = None,
               atol: float | None = None, **_) -> str:
    """One rank's mismatch in words: for two tensors of one shape, the shape, how many elements
    differ, the first three differing positions with both values, and the largest error;
    otherwise both values, summarised whole (never cut inside a number)."""
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) \
            or got.shape != want.shape or got.is_complex():
        shapes = (f"shape {tuple(got.shape)} (expected {tuple(want.shape)}): " if
                  isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) else "")
        reason = f" ({str(exc).strip().splitlines()[0]})" if exc is not None else ""
        return f"{shapes}expected {_short(want)}, got {_short(got)}{reason}"
    g, w = got.detach().double(), want.detach().double()
    close = torch.isclose(g, w, rtol=1.3e-6 if rtol is None else rtol,
                          atol=1e-5 if atol is None else atol, equal_nan=True)
    bad = (~close).nonzero()
    err = torch.nan_to_num((g - w).abs(), nan=float("inf"))
    worst = (tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
             if err.numel() else ())
    first = "; ".join(f"at {tuple(i.tolist())} expected {w[tuple(i)].item():.6g}, got "
                      f"{g[tuple(i)].item():.6g}" for i in bad[:3])
    dtype = "" if got.dtype == want.dtype else f", dtype {got.dtype} (expected {want.dtype})"
    return (f"shape {tuple(got.shape)}{dtype}: {len(bad)} of {got.numel()} elements differ; "
            f"first {first or 'none beyond tolerance'}; largest error "
            f"{err.max().item() if err.numel() else 0:.3g} at {worst}; expected {_short(want)}, "
            f"got {_short(got)}")


def _short(value) -> str:
    """A value's repr on one line: tensors summarised by torch (first and last elements, never
    a cut number), anything else cut after its last whole item within 160 characters."""
    if isinstance(value, torch.Tensor):
        with torch._tensor_str.printoptions(threshold=8, edgeitems=3, linewidth=10_000):
            return " ".join(repr(value).split())
    text = " ".join(repr(value).split())
    if len(text) <= 160:
        return text
    cut = max(text.rfind(", ", 0, 150), 0)
    return text[:cut] + f", ... ({len(text) - cut} more characters)"
