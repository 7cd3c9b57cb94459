"""Profiling a training step on every rank with ``torch.profiler``.

:func:`profile_steps` runs a training step under ``torch.profiler`` with its
*wait / warm-up / active* schedule (the first steps are skipped, the next warm
the profiler up, the last are recorded; the PyTorch profiler recipe), writes
one Chrome trace per rank (open it in https://ui.perfetto.dev or
chrome://tracing) and reduces the trace to a few numbers
(:class:`~.trace.RankProfile`, read by :mod:`.trace`). :func:`profile_run`
does this on N ranks. The communication share from the trace is
cross-checked with :class:`lecture_lib.metrics.Timer` phases when the step
times its own communication (:attr:`~.trace.RankProfile.timer_comm_share`).
``profile_run(..., emulate="h100-node")`` profiles the same step in emulated
time instead (:mod:`.emulated`).
"""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

from ..emulate import preset
from ..metrics import Timer
from ..runtime import launch
from .emulated import profile_steps_emulated
from .events import PHASE_PREFIX, read_trace
from .trace import RankProfile, shares


def _check_schedule(wait: int, warmup: int, active: int) -> None:
    for name, value in (("wait", wait), ("warmup", warmup), ("active", active)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a whole number >= 0, not {value!r}")
    if active < 1:
        raise ValueError(f"active must be >= 1 (the steps that are recorded), not {active}")


@contextmanager
def _without_kineto_banner():
    """Drop the profiler library's "USDT: profiler_start/stop" lines from stderr.

    Everything else written to stderr inside the block is passed on at its end.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(True)
                    if not ln.startswith("USDT:")]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


class TracedTimer(Timer):
    """A :class:`~lecture_lib.metrics.Timer` whose phases also appear in the trace.

    Each ``with timer(phase)`` is a ``phase:<name>`` range of the trace
    (``torch.profiler.record_function``), around the timer's own clock, so the
    trace can say what the phase held (:meth:`~.trace.RankProfile.step_comm_shares`).
    """

    @contextmanager
    def __call__(self, phase: str):
        with torch.profiler.record_function(PHASE_PREFIX + phase), super().__call__(phase):
            yield


def profile_steps(step, *, wait: int = 1, warmup: int = 1, active: int = 3,
                  trace_dir: str | None = None, timer: Timer | None = None,
                  row_limit: int = 12) -> RankProfile:
    """Run ``step(i)`` for ``wait + warmup + active`` steps under ``torch.profiler``.

    Call it inside a rank function. ``timer``, when the step times its phases
    with it, is reset before the first recorded step so its totals cover the same
    steps as the trace. With ``trace_dir`` the trace is written to
    ``trace_dir/rank<r>.json``.
    """
    _check_schedule(wait, warmup, active)
    if not callable(step):
        raise TypeError(f"step must be callable, not {type(step).__name__}")
    rank = dist.get_rank() if dist.is_initialized() else 0
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        activities.append(ProfilerActivity.CUDA)
    with _without_kineto_banner(), profile(
            activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active),
            on_trace_ready=lambda p: None) as prof:
        for i in range(wait + warmup + active):
            if timer is not None and i == wait + warmup:
                timer.reset()
            step(i)
            prof.step()
    if trace_dir is not None:
        os.makedirs(trace_dir, exist_ok=True)
        path = os.path.join(trace_dir, f"rank{rank}.json")
        prof.export_chrome_trace(path)
        events, steps = read_trace(path)
    else:
        path = None
        with tempfile.TemporaryDirectory(prefix="lecture_trace_") as tmp:
            prof.export_chrome_trace(os.path.join(tmp, "trace.json"))
            events, steps = read_trace(os.path.join(tmp, "trace.json"))
    comm, busy = shares(events, steps)
    sort_by = "self_cuda_time_total" if len(activities) > 1 else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)
    return RankProfile(rank, steps, events, comm, busy, table, path,
                       dict(timer.totals) if timer is not None else {},
                       list(timer.spans) if timer is not None else [])


def profile_run(make_step, world_size: int, *args, wait: int = 1, warmup: int = 1,
                active: int = 3, trace_dir: str | None = None, timeout: float = 120,
                emulate=None, **kwargs) -> list[RankProfile]:
    """Profile a step on ``world_size`` ranks; one :class:`RankProfile` per rank.

    ``make_step(timer, *args, **kwargs)`` runs on every rank, builds the model and
    returns ``step(i)``; the step may time its phases with ``timer`` (a
    :class:`lecture_lib.metrics.Timer` on the rank's device), e.g. ``with
    timer("comm"): ...``, for the cross-check with the trace. With ``emulate``
    (a preset of :mod:`lecture_lib.emulate`, e.g. ``"h100-node"``) the steps run
    under the emulation and the profile is read in emulated time
    (:func:`~.emulated.profile_steps_emulated`; no trace file).
    """
    _check_schedule(wait, warmup, active)
    if not callable(make_step):
        raise TypeError(f"make_step must be callable, not {type(make_step).__name__}")
    if emulate is not None:
        emulate = preset(emulate)                  # an unknown preset fails here, not on a rank
        if trace_dir is not None:
            raise ValueError("an emulated profile has no torch.profiler trace: drop trace_dir")

    def rank_fn():
        timer = (Timer if emulate is not None else TracedTimer)(launch.device())
        step = make_step(timer, *args, **kwargs)
        if emulate is not None:
            return profile_steps_emulated(step, emulate, wait=wait, warmup=warmup,
                                          active=active, timer=timer)
        return profile_steps(step, wait=wait, warmup=warmup, active=active,
                             trace_dir=trace_dir, timer=timer)

    return launch.run(rank_fn, world_size, timeout=timeout)
