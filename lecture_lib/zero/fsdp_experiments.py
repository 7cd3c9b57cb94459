"""What notebook 03 measures about FSDP: bytes on the wire, memory, prefetch timelines.

* :func:`measure_comm_volume`: the bytes a rank sends in one step, from the
  :func:`lecture_lib.comm.record_comm` recorder, for ZeRO-1, ZeRO-2 and FSDP
  (resharding or not, 16-bit compute or not), in units of Psi, the bytes of
  one full copy of the parameters in their own dtype (Rajbhandari et al. 2020,
  section 7: 2 Psi for ZeRO-1/2 and data parallelism, 3 Psi for stage 3).
* :func:`measure_fsdp_memory`: the full-weight bytes held at the peak, with and
  without ``reshard_after_forward``.
* :func:`fsdp_timeline`: one rank's spans of compute, all-gathers in flight and
  time blocked waiting, with prefetching on or off, read off the model's
  events against the rank's ``timer`` (a :class:`lecture_lib.metrics.Timer`:
  real time here; any timer with ``t0`` and, optionally, ``now()`` will do, so
  an emulated clock can replace it).
* :func:`fsdp_timeline_emulated`: the same experiment in the virtual time of
  an accelerator cluster (:func:`lecture_lib.emulate.emulated`, e.g. H100s on
  NVLink), where the compute is fast enough for the all-gathers to matter and
  prefetching hides them; it adds the last step's two emulated streams (compute,
  waiting, every collective on the wire) and ``hidden``, the time a collective is on
  the wire while the compute stream is busy (all-gathers and reduce-scatters alike;
  ``hidden_gathers`` the all-gathers' part): the step is compute + communication - hidden.
* :func:`measure_step_time_emulated`: one step of plain data parallelism
  (one all-reduce after backward), ZeRO-1, ZeRO-2 and ZeRO-3 in emulated time,
  split into compute, communication and the part of it hidden behind compute,
  with the calls and bytes of every kind of collective the rank issued.
"""
from __future__ import annotations

import time

import torch

from .. import data_parallel, emulate
from ..comm import group_info, record_comm
from ..metrics import Timer
from ..models import make_optimizer, shard
from ..precision import LossScaler
from ..runtime import device
from .experiments import shard_model
from .fsdp import FullyShardedModel
from .fsdp_api import fsdp_on_after_backward

VOLUME_CASES = ("zero1", "zero2", "fsdp", "fsdp_keep", "fsdp_bf16")
STEP_CASES = ("ddp", "zero1", "zero2", "fsdp", "fsdp_no_prefetch")
_OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}


def _build(case: str, make_model, group, optimizer: str = "sgd"):
    model = make_model().to(device())
    if case == "ddp":                      # plain data parallelism: one all-reduce after backward
        return data_parallel.DDPFlat(model, group), make_optimizer(model.parameters(),
                                                                   optimizer, 1e-2)
    if case in ("zero1", "zero2"):
        return shard_model(model, 1 if case == "zero1" else 2, _OPTIMIZERS[optimizer], group,
                           lr=1e-2)
    kwargs = {"fsdp_keep": {"reshard_after_forward": False},
              "fsdp_bf16": {"compute_dtype": torch.bfloat16},
              "fsdp_no_prefetch": {"prefetch": False}}.get(case, {})
    model = FullyShardedModel(model, group=group, **kwargs)
    return model, make_optimizer(model.parameters(), optimizer, 1e-2)


def _one_step(model, opt, x, y, scaler: LossScaler | None = None) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = model(x, y)
    (loss.float() * (scaler.scale if scaler else 1.0)).backward()
    if isinstance(model, FullyShardedModel):
        fsdp_on_after_backward(model, opt)
    elif isinstance(model, data_parallel.DDPFlat):
        model.finish_gradient_synchronization()
    opt.step()
    return loss.detach()


def measure_comm_volume(make_model, batches, cases=VOLUME_CASES, group=None) -> dict:
    """Rank function: ``{case: {"sent": bytes, "psi": sent / Psi, "summary": ...}}``.

    ``psi`` is the bytes one rank sent in one step divided by Psi and by
    (N-1)/N (what a ring all-gather of Psi sends), so the paper's 2 and 3
    read directly. Also ``"Psi"`` (bytes) and ``"world_size"``.
    """
    rank, world = group_info(group, required=True)
    x, y = (t.to(device()) for t in shard(batches(0), rank, world))
    psi = sum(p.numel() * p.element_size() for p in make_model().parameters())
    out = {"Psi": psi, "world_size": world}
    for case in cases:
        model, opt = _build(case, make_model, group)
        with record_comm() as log:
            _one_step(model, opt, x, y)
        sent = log.sent_bytes()
        out[case] = {"sent": sent, "psi": sent / psi / ((world - 1) / world),
                     "summary": log.summary()}
    return out


def measure_fsdp_memory(make_model, batches, group=None) -> dict:
    """Rank function: peak full-weight bytes and bytes sent, resharding after forward or not."""
    rank, world = group_info(group, required=True)
    x, y = (t.to(device()) for t in shard(batches(0), rank, world))
    out = {}
    for reshard in (True, False):
        model = FullyShardedModel(make_model().to(device()), group=group,
                                  reshard_after_forward=reshard)
        opt = make_optimizer(model.parameters(), "sgd", 1e-2)
        with record_comm() as log:
            _one_step(model, opt, x, y)
        out[reshard] = {"peak_gathered_bytes": model.peak_gathered_bytes,
                        "sent": log.sent_bytes(),
                        "gathers": log.calls(kind="all_gather")}
    return out


class _Stamped(list):
    """The model's event list, each event stamped with the timer's clock."""

    def __init__(self, timer):
        super().__init__()
        self.timer = timer

    def now(self) -> float:
        clock = getattr(self.timer, "now", None)
        return clock() if clock is not None else time.perf_counter() - self.timer.t0

    def append(self, event) -> None:
        super().append((*event, self.now()))


def event_spans(events) -> list[tuple[str, str, str, float, float]]:
    """``[(kind, unit, phase, start, end)]``: kind compute, in flight or blocked."""
    spans, opened = [], {}
    for what, unit, phase, t in events:
        key = (unit, phase)
        if what == "gather":
            opened[("flight",) + key] = t
        elif what == "wait":
            opened[("blocked",) + key] = t
        elif what == "full":
            for kind, name in (("flight", "in flight"), ("blocked", "blocked")):
                start = opened.pop((kind,) + key, None)
                if start is not None:
                    spans.append((name, unit, phase, start, t))
        elif what == "compute":
            opened[("compute",) + key] = t
        elif what in ("done", "reduce_scatter", "free"):
            start = opened.pop(("compute",) + key, None)
            if start is not None:
                spans.append(("compute", unit, phase, start, t))
    return spans


def overlapped_seconds(spans) -> float:
    """Seconds during which an all-gather was in flight while another unit computed."""
    total = 0.0
    for kind, unit, _, a, b in spans:
        if kind != "in flight":
            continue
        for kind2, unit2, _, c, d in spans:
            if kind2 == "compute" and unit2 != unit:
                total += max(0.0, min(b, d) - max(a, c))
    return total


def fsdp_timeline(make_model, batches, steps: int, prefetch: bool, timer, group=None,
                  **fsdp_kwargs) -> dict:
    """Rank function: train ``steps`` and keep the last step's spans on ``timer``'s clock.

    Returns ``spans`` (:func:`event_spans`), ``events`` (the last step's, without
    times, for :func:`lecture_lib.figures.pictures.zero_shards.shard_states`), ``step_seconds``
    (each step, on the timer), ``step_start`` (the last step's start on the timer),
    ``blocked`` and ``overlapped`` seconds of the last step, and ``losses``.
    """
    rank, world = group_info(group, required=True)
    model = FullyShardedModel(make_model().to(device()), group=group, prefetch=prefetch,
                              **fsdp_kwargs)
    opt = make_optimizer(model.parameters(), "adamw", 1e-2)
    seconds, losses = [], []
    for step in range(steps):
        x, y = (t.to(device()) for t in shard(batches(step), rank, world))
        model.events = _Stamped(timer)
        with timer("step"):
            loss = _one_step(model, opt, x, y)
        losses.append(loss.item())
        seconds.append(timer.spans[-1][2] - timer.spans[-1][1])
    events = list(model.events)
    model.events = None
    spans = event_spans(events)
    for kind, unit, phase, a, b in spans:
        timer.spans.append((f"{kind} {unit} {phase}", a, b))
    return {"spans": spans, "events": [e[:3] for e in events], "step_seconds": seconds,
            "losses": losses, "step_start": timer.spans[steps - 1][1] if steps else 0.0,
            "blocked": sum(b - a for k, _, _, a, b in spans if k == "blocked"),
            "overlapped": overlapped_seconds(spans),
            "units": [u.name for u in model.units()]}


def both_busy(xs, ys) -> list[tuple[float, float]]:
    """The intervals during which a span of ``xs`` and a span of ``ys`` run at once.

    Each list holds one stream's spans (which do not overlap one another), so the intervals
    do not overlap either and their lengths add up.
    """
    return [(max(a, c), min(b, d)) for a, b in xs for c, d in ys if min(b, d) > max(a, c)]


def fsdp_timeline_emulated(make_model, batches, steps: int, prefetch: bool,
                           preset="h100-node", group=None, **fsdp_kwargs) -> dict:
    """Rank function: :func:`fsdp_timeline` run under ``emulate.emulated(preset)``.

    Everything :func:`fsdp_timeline` returns, in emulated seconds, plus the last step's two
    emulated streams, each span cut to the step, in seconds since its start:
    ``compute`` (the compute stream's kernels, ``[(start, end)]``), ``idle`` (the compute
    stream waiting for a collective), ``wire`` (every collective on the communication
    stream, ``[(kind, start, end)]``: the all-gathers, the gradients' reduce-scatters, the
    replicated parameters' all-reduce); ``hidden``: the seconds during which a collective,
    any of them, is on the wire while the compute stream is busy, so that the step is
    compute + communication - hidden (= compute + waiting); ``hidden_gathers``: the part of
    ``hidden`` that is all-gathers; and ``time_kind`` (e.g. "emulated H100 + NVLink").
    """
    timer = Timer()
    with emulate.emulated(preset) as clock:
        timer.reset()                         # t0 on the emulated clock
        out = fsdp_timeline(make_model, batches, steps, prefetch, timer, group, **fsdp_kwargs)
        clock.resolve()
    start = timer.t0_emulated + out["step_start"]
    end = start + out["step_seconds"][-1]
    inside = [(kind, max(a, start) - start, min(b, end) - start, text)
              for kind, a, b, text in clock.spans if b > start and a < end]
    compute = [(a, b) for kind, a, b, _ in inside if kind not in ("comm", "idle")]
    wire = [(text, a, b) for kind, a, b, text in inside if kind == "comm"]
    gathers = [(a, b) for text, a, b in wire if text == "all_gather"]
    out.update(compute=compute, idle=[(a, b) for kind, a, b, _ in inside if kind == "idle"],
               wire=wire,
               hidden=sum(b - a for a, b in both_busy([(a, b) for _, a, b in wire], compute)),
               hidden_gathers=sum(b - a for a, b in both_busy(gathers, compute)),
               time_kind=timer.time_kind)
    return out


def _emulated_step(case, make_model, batches, steps, preset, group, rank, world) -> dict:
    """The last of ``steps`` emulated steps of ``case`` (AdamW): its split and collectives."""
    with emulate.emulated(preset) as clock:
        model, opt = _build(case, make_model, group, "adamw")
        for step in range(steps):
            x, y = (t.to(device()) for t in shard(batches(step), rank, world))
            start, totals = clock.synchronize(), dict(clock.totals)
            calls, sent = dict(clock.calls_by_kind), dict(clock.bytes_by_kind)
            _one_step(model, opt, x, y)
            end = clock.synchronize()
    delta = {k: v - totals.get(k, 0.0) for k, v in clock.totals.items()}
    compute = sum(v for k, v in delta.items() if k not in ("comm", "idle"))
    comm = delta.get("comm", 0.0)
    return {"step": end - start, "compute": compute, "comm": comm,
            "hidden": compute + comm - (end - start),
            "calls": {k: v - calls.get(k, 0) for k, v in clock.calls_by_kind.items()
                      if v > calls.get(k, 0)},
            "bytes": {k: v - sent.get(k, 0) for k, v in clock.bytes_by_kind.items()
                      if v > sent.get(k, 0)}}


def measure_step_time_emulated(make_model, batches, cases=STEP_CASES, steps: int = 2,
                               preset="h100-node", group=None) -> dict:
    """Rank function: ``{case: split}`` of each case's last step, in emulated seconds.

    Cases: ``"ddp"`` (plain data parallelism, one all-reduce after backward),
    ``"zero1"``, ``"zero2"``, ``"fsdp"`` (ZeRO-3, prefetching) and
    ``"fsdp_no_prefetch"``, all with AdamW. A split has ``step``, ``compute``
    (every operation charged, forward, backward and optimizer), ``comm`` (the
    collectives' time on the communication stream), ``hidden`` (compute + comm -
    step: communication that ran while the rank computed) and the ``calls`` and
    ``bytes`` (full buffers) of each kind of collective. Also ``"world_size"``.
    """
    unknown = [c for c in cases if c not in STEP_CASES]
    if unknown:
        raise ValueError(f"unknown cases {unknown}; known: {STEP_CASES}")
    rank, world = group_info(group, required=True)
    out = {"world_size": world}
    for case in cases:
        out[case] = _emulated_step(case, make_model, batches, steps, preset, group, rank, world)
    return out
