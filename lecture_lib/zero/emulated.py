"""ZeRO and FSDP on an emulated cluster: one step's time and its split, small or at real size.

One rank function, :func:`zero_steps`, trains a GPT of a given :class:`~lecture_lib.models.
GPTConfig` with one of the cases of :data:`.experiments.CASES` (DDP, ZeRO-1, ZeRO-2, FSDP
with or without prefetching and resharding) inside the caller's emulation, and splits the
last step: on a small model with real tensors (:func:`measure_step_time_emulated`), or at
real size in the dry run, on fake tensors (:func:`time_at_scale`: GPT-2, Llama 3 shapes on
8 emulated H100s; nothing is computed, every operation and collective is charged). The same
code either way, so the dry clock equals the real one on a small model (the tests check).

The split (Rajbhandari et al. 2020, section 7, for what each stage sends)::

    step = compute + comm - hidden = compute + exposed

``compute``: the compute stream busy (kernels, and waits for the host's launches);
``comm``: the communication stream busy; ``hidden``: communication while the rank computed;
``exposed``: the compute stream waiting for a collective.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from .. import emulate, observe
from ..comm import group_info
from ..models import GPT, GPTConfig, real_size
from ..precision import checkpoint_blocks
from ..runtime import device
from .experiments import build, check_cases, held_bytes, one_step, peak_gathered_bytes

STEP_CASES = ("ddp", "zero1", "zero2", "fsdp", "fsdp_no_prefetch")


def zero_steps(case: str, cfg: GPTConfig, batch_per_rank: int, steps: int = 2, group=None,
               checkpointing: bool = False) -> dict:
    """Rank function, inside ``emulate.emulated(...)`` (real tensors or the dry run).

    ``steps`` AdamW steps of ``case`` on ``GPT(cfg)``, each rank on ``batch_per_rank``
    sequences of random tokens (made here, so fake in a dry run); ``checkpointing``
    recomputes each block in backward (:func:`lecture_lib.precision.checkpoint_blocks`).
    The last step's ``step``, ``compute``, ``comm``, ``hidden``, ``exposed`` and ``host``
    (seconds the host spent launching kernels) in emulated seconds, ``by_kind`` (its compute in
    :func:`lecture_lib.emulate.seconds_by_kind`'s four kinds); ``calls`` and ``bytes``
    (full buffers) of each kind of collective; ``streams`` (:func:`step_streams`) and
    ``exposed_by_kind`` (:func:`exposed_by_kind`); ``held``
    (model-state bytes after the step, :func:`.experiments.held_bytes`) and, for FSDP,
    ``peak_gathered_bytes`` (full weights held at once), ``unit_spans`` (each unit's
    compute, all-gather in flight and wait, :func:`event_spans`, seconds since the step's
    start) and ``events`` (for :func:`lecture_lib.figures.pictures.zero_shards.shard_states`).
    """
    clock = emulate.current()
    if clock is None:
        raise RuntimeError("zero_steps runs inside emulate.emulated(...)")
    if checkpointing and case.startswith("fsdp"):
        raise ValueError("activation checkpointing with this FSDP is not supported: the "
                         "recomputed forward would free its unit in the middle of backward")
    rank, _ = group_info(group, required=True)
    model = GPT(cfg, seed=0).to(device())
    if checkpointing:
        checkpoint_blocks(model)
    wrapped, opt = build(case, model, group, "adamw")
    for step in range(steps):
        seed = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randint(cfg.vocab_size, (batch_per_rank, cfg.seq_len), generator=seed)
        x = x.to(device())
        start, before = clock.synchronize(), _counters(clock)
        seen = observe.Watcher(facts=StampedNotes(clock.now))
        with observe.watch(seen):
            one_step(wrapped, opt, x, x)
        host = clock.host - start
        end = clock.synchronize()
    out = _split(clock, before, start, end)
    out.update(host=host, streams=step_streams(clock, start, end),
               held=held_bytes(wrapped, opt), peak_gathered_bytes=None)
    out["exposed_by_kind"] = exposed_by_kind(out["streams"])
    if case.startswith("fsdp"):
        events = [(e, unit, phase, t - start) for e, unit, phase, t in fsdp_events(seen.facts)]
        out.update(peak_gathered_bytes=peak_gathered_bytes(seen.notes("fsdp")),
                   unit_spans=event_spans(events), events=[e[:3] for e in events])
    return out


def measure_step_time_emulated(cfg: GPTConfig, batch_per_rank: int, cases=STEP_CASES,
                               steps: int = 2, preset="h100-node", group=None) -> dict:
    """Rank function: ``{case: split}`` of each case's last step (:func:`zero_steps`), each
    case under its own ``emulate.emulated(preset)``, real tensors; also ``"world_size"``."""
    cases = check_cases(cases)
    out = {"world_size": group_info(group, required=True)[1]}
    for case in cases:
        with emulate.emulated(preset):
            out[case] = zero_steps(case, cfg, batch_per_rank, steps, group)
    return out


def time_at_scale(model: str = "GPT-2 medium", cases=("ddp", "zero1", "zero2", "fsdp"),
                  world_size: int = 8, preset="h100-node", batch_per_rank: int = 8,
                  steps: int = 2, checkpointing: bool = False, timeout: float = 600,
                  **changes) -> dict:
    """Each case's step at real size, in the dry run on ``world_size`` emulated ranks.

    ``model``: a name of :data:`lecture_lib.models.REAL_SIZE` (``changes``: its fields
    changed, e.g. ``n_layers=4``). Returns plain data: ``cases`` (rank 0's
    :func:`zero_steps` split of each), ``config``, ``params`` (Psi, the parameter count),
    ``tokens_per_rank``, ``world_size``, ``preset`` (the cluster's label), ``steps`` and
    ``wall_seconds`` (real seconds the dry run took on this machine).
    """
    cases = check_cases(cases)
    cfg = real_size(model, **changes)
    cluster = emulate.preset(preset)
    t0 = time.perf_counter()
    results = emulate.run(_cases_rank, world_size, cases, cfg, batch_per_rank, steps,
                          checkpointing, preset=cluster, dry_run=True, timeout=timeout)
    return {"model": model, "config": dataclasses.asdict(cfg), "params": cfg.num_params(),
            "tokens_per_rank": batch_per_rank * cfg.seq_len, "world_size": world_size,
            "preset": cluster.label(), "steps": steps, "cases": results[0].result,
            "wall_seconds": time.perf_counter() - t0}


def _cases_rank(cases, cfg, batch_per_rank, steps, checkpointing) -> dict:
    return {case: zero_steps(case, cfg, batch_per_rank, steps, checkpointing=checkpointing)
            for case in cases}


# ----------------------------------------------------------------------------
# Reading the clock
# ----------------------------------------------------------------------------

def _counters(clock) -> dict:
    return {"totals": dict(clock.totals), "calls": dict(clock.calls_by_kind),
            "bytes": dict(clock.bytes_by_kind), "ops": dict(clock.seconds_by_op)}


def _split(clock, before: dict, start: float, end: float) -> dict:
    totals = {k: v - before["totals"].get(k, 0.0) for k, v in clock.totals.items()}
    compute = sum(v for k, v in totals.items() if k not in ("comm", "idle"))
    comm = totals.get("comm", 0.0)
    grew = {kind: {k: v - before[kind].get(k, 0) for k, v in now.items()
                   if v > before[kind].get(k, 0)}
            for kind, now in (("calls", clock.calls_by_kind), ("bytes", clock.bytes_by_kind))}
    ops = {k: v - before["ops"].get(k, 0.0) for k, v in clock.seconds_by_op.items()}
    return {"step": end - start, "compute": compute, "comm": comm,
            "hidden": compute + comm - (end - start), "exposed": end - start - compute,
            "by_kind": emulate.seconds_by_kind(ops), **grew}


def step_streams(clock, start: float, end: float) -> dict:
    """The two emulated streams between ``start`` and ``end``, each span cut to them, in
    seconds since ``start``: ``compute`` (kernels, ``[(start, end)]``), ``idle`` (the
    compute stream waiting for a collective) and ``wire`` (every collective,
    ``[(kind, start, end)]``)."""
    inside = [(kind, max(a, start) - start, min(b, end) - start, text)
              for kind, a, b, text in clock.spans if b > start and a < end]
    return {"compute": [(a, b) for kind, a, b, _ in inside if kind not in ("comm", "idle")],
            "idle": [(a, b) for kind, a, b, _ in inside if kind == "idle"],
            "wire": [(text, a, b) for kind, a, b, text in inside if kind == "comm"]}


def exposed_by_kind(streams: dict) -> dict[str, float]:
    """Seconds the compute stream waited while each kind of collective was on the wire (the
    communication stream runs one collective at a time, so each wait is one kind's)."""
    out: dict[str, float] = {}
    for a, b in streams["idle"]:
        for kind, c, d in streams["wire"]:
            if min(b, d) > max(a, c):
                out[kind] = out.get(kind, 0.0) + min(b, d) - max(a, c)
    return out


class StampedNotes(list):
    """A watcher's notes (``observe.Watcher(facts=StampedNotes(clock))``), each stamped with
    ``clock()`` as it arrives (``"at"``)."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def append(self, fact) -> None:
        name, data = fact
        super().append((name, {**data, "at": self.clock()}))


def fsdp_events(facts) -> list[tuple[str, str, str, float]]:
    """``[(event, unit, phase, time)]`` of FSDP's stamped notes, phase ``"forward"`` until
    the step says backward begins (:func:`.experiments.one_step`)."""
    events, phase = [], "forward"
    for name, data in facts:
        if name == "step":
            phase = data["phase"]
        elif name == "fsdp":
            events.append((data["event"], data["unit"], phase, data["at"]))
    return events


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


