"""What notebook 03b measures about FSDP: bytes on the wire, memory, prefetch timelines.

* :func:`measure_comm_volume`: the bytes a rank sends in one step, from the
  :func:`lecture_lib.comm.record_comm` recorder, for ZeRO-1, ZeRO-2 and FSDP
  (resharding or not, 16-bit compute or not), in units of Psi, the bytes of
  one full copy of the parameters in their own dtype (Rajbhandari et al. 2020,
  section 7: 2 Psi for ZeRO-1/2 and data parallelism, 3 Psi for stage 3).
* :func:`measure_fsdp_memory`: the full-weight bytes held at the peak, with and
  without ``reshard_after_forward``.
* :func:`fsdp_timeline`: one rank's spans of compute, all-gathers in flight and
  time blocked waiting, with prefetching on or off, read off what the units tell a
  watcher (``observe.note("fsdp", ...)``), each note stamped on the rank's ``timer``
  (a :class:`lecture_lib.metrics.Timer`: real time here, emulated time under the
  emulation).
* :func:`fsdp_timeline_emulated`: the same experiment in the virtual time of
  an accelerator cluster (:func:`lecture_lib.emulate.emulated`, e.g. H100s on
  NVLink), where the compute is fast enough for the all-gathers to matter and
  prefetching hides them; it adds the last step's two emulated streams (compute,
  waiting, every collective on the wire) and ``hidden``, the time a collective is on
  the wire while the compute stream is busy (all-gathers and reduce-scatters alike;
  ``hidden_gathers`` the all-gathers' part): the step is compute + communication - hidden.

Every stage's step time, small or at real size: :mod:`.emulated`.
"""
from __future__ import annotations

from .. import emulate, observe
from ..comm import group_info, record_comm
from ..metrics import Timer
from ..models import make_optimizer, shard
from ..runtime import device
from .emulated import (
    StampedNotes,
    event_spans,
    fsdp_events,
    overlapped_seconds,
    step_streams,
)
from .experiments import build, one_step, peak_gathered_bytes
from .fsdp import FullyShardedModel

VOLUME_CASES = ("zero1", "zero2", "fsdp", "fsdp_keep", "fsdp_bf16")


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
        model, opt = build(case, make_model().to(device()), group)
        with record_comm() as log:
            one_step(model, opt, x, y)
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
        with observe.watch() as seen, record_comm() as log:
            one_step(model, opt, x, y)
        out[reshard] = {"peak_gathered_bytes": peak_gathered_bytes(seen.notes("fsdp")),
                        "sent": log.sent_bytes(),
                        "gathers": log.calls(kind="all_gather")}
    return out


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
        seen = observe.Watcher(facts=StampedNotes(timer.now))
        with observe.watch(seen), timer("step"):
            loss = one_step(model, opt, x, y)
        losses.append(loss.item())
        seconds.append(timer.spans[-1][2] - timer.spans[-1][1])
    events = fsdp_events(seen.facts)
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
    streams = step_streams(clock, start, start + out["step_seconds"][-1])
    wire, compute = streams["wire"], streams["compute"]
    gathers = [(a, b) for text, a, b in wire if text == "all_gather"]
    out.update(streams,
               hidden=sum(b - a for a, b in both_busy([(a, b) for _, a, b in wire], compute)),
               hidden_gathers=sum(b - a for a, b in both_busy(gathers, compute)),
               time_kind=timer.time_kind)
    return out
