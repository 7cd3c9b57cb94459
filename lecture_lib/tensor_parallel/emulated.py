"""Tensor parallelism timed at real size: one transformer layer in the dry run.

:func:`layer_step` is a rank function: one layer of a :class:`GPTConfig`, split
over the group (:class:`ParallelBlock`, or :class:`SequenceParallelBlock`),
forward and backward in bf16, timed on the emulated clock it runs under. The
same function runs on real tensors (a small model, every value computed) and
in the dry run (fake tensors: a GPT-3 175B or Llama 3 70B layer in seconds),
and both read the same clock (``tests/test_tensor_parallel_emulated.py``).
:func:`time_at_scale` runs it for several tensor-parallel sizes and links
(NVLink inside a node against InfiniBand across nodes), with and without
sequence parallelism.

The lesson it measures (Shoeybi et al. 2019; Narayanan et al. 2021, section
3.3): each rank's compute falls as ``1/tp`` while each rank still sends
``4 (tp-1)/tp b s h`` elements per layer forward and as many backward, so the
share of the step in collectives grows with ``tp``, and much faster on a slow
link. The collectives are blocking (Megatron's f and g): the compute stream
waits for every one, so all of that time is exposed.
"""
from __future__ import annotations

import time

import torch

from .. import comm, emulate, models
from ..progress import progress
from .experiments import split_block
from .model import check_block_split

LINKS = {"NVLink": "h100-node", "InfiniBand": "h100-ib"}
"""The default presets: 8 H100s joined by NVLink, and H100s one per node on InfiniBand."""


def layer_step(cfg: models.GPTConfig, batch: int = 1, sequence_parallel: bool = False,
               group=None) -> dict:
    """Rank function, inside :func:`lecture_lib.emulate.emulated` (real or dry): one layer's
    forward and backward in bf16 over ``group``; its emulated split (see :func:`split_of`)."""
    clock = emulate.current()
    if clock is None:
        raise RuntimeError("layer_step times on the emulated clock: run it under "
                           "emulate.emulated(...) or emulate.run(...)")
    tp = comm.group_info(group)[1]
    tokens = cfg.seq_len // tp if sequence_parallel else cfg.seq_len   # my part of the sequence
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)          # a bf16 run's weights and activations
    try:
        block = split_block(models.Block(cfg), group, sequence_parallel)
        x = torch.randn(batch, tokens, cfg.d_model, requires_grad=True)
        mark = _mark(clock)                          # building the layer is not timed
        block(x).sum().backward()
        return split_of(clock, mark)
    finally:
        torch.set_default_dtype(before)


def time_at_scale(cfg: models.GPTConfig, tps=(1, 2, 4, 8), links: dict | None = None,
                  batch: int = 1, sequence_parallel=(False,), timeout: float = 300) -> list[dict]:
    """:func:`layer_step` in the dry run for every ``tp`` in ``tps``, link of ``links``
    (``{name: preset}``, default :data:`LINKS`) and ``sequence_parallel`` setting.

    All checked before any process starts. One rank sends nothing, so ``tp = 1`` runs once
    per setting, on the first link. Returns one row per run: rank 0's :func:`split_of`
    with ``tp``, ``link``, ``preset`` (its label), ``sequence_parallel``, ``mfu`` (counted
    FLOPs over the step and the device's bf16 dense peak) and ``wall_s`` (real seconds of
    the call, starting the ranks included).
    """
    links = dict(LINKS if links is None else links)
    if not links:
        raise ValueError("links must be a non-empty {name: preset} dict")
    clusters = {name: emulate.preset(p) for name, p in links.items()}
    settings = [sequence_parallel] if isinstance(sequence_parallel, bool) else list(
        sequence_parallel)
    if not settings or any(not isinstance(sp, bool) for sp in settings):
        raise ValueError(f"sequence_parallel must be True, False or a list of them, "
                         f"not {sequence_parallel!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a whole number >= 1, not {batch!r}")
    tps = list(tps)
    if not tps:
        raise ValueError("tps must name at least one tensor-parallel size")
    for tp in tps:
        for sp in settings:
            check_block_split(cfg, tp, sp)
    first = next(iter(clusters))
    runs = [(tp, name, sp) for sp in settings for name in clusters for tp in tps
            if tp > 1 or name == first]
    rows = []
    for tp, name, sp in progress(runs, "tensor parallel at real size, dry run: one layer each"):
        start = time.perf_counter()
        out = emulate.run(layer_step, tp, cfg, batch, sp, preset=clusters[name], dry_run=True,
                          timeout=timeout)[0].result
        peak = clusters[name].flops(torch.bfloat16)
        rows.append({**out, "tp": tp, "link": name, "preset": emulate.label(clusters[name]),
                     "sequence_parallel": sp, "mfu": out["flops"] / (out["step_s"] * peak),
                     "wall_s": time.perf_counter() - start})
    return rows


def split_of(clock, mark: dict) -> dict:
    """What the clock did since ``mark``: ``step_s`` (both streams done), ``compute_s`` (the
    compute stream busy), ``comm_s`` (the communication stream busy), ``exposed_s`` (the
    step outside compute: waiting for collectives), ``comm_share`` (comm / step),
    ``comm_to_compute``, ``flops``, ``bytes`` and ``calls`` per collective kind, and the
    ``timeline`` (spans from the mark)."""
    end = clock.synchronize()
    start = mark["start"]
    totals = {k: v - mark["totals"].get(k, 0.0) for k, v in clock.totals.items()}
    comm_s = totals.get("comm", 0.0)
    compute_s = sum(v for k, v in totals.items() if k not in ("comm", "idle"))
    return {"step_s": end - start, "compute_s": compute_s, "comm_s": comm_s,
            "exposed_s": end - start - compute_s, "comm_share": comm_s / (end - start),
            "comm_to_compute": comm_s / compute_s, "flops": clock.flops - mark["flops"],
            "bytes": _since(clock.bytes_by_kind, mark["bytes"]),
            "calls": _since(clock.calls_by_kind, mark["calls"]),
            "timeline": [(k, s - start, e - start, t) for k, s, e, t in
                         clock.spans[mark["spans"]:]]}


def _mark(clock) -> dict:
    """The clock's state now, both streams synchronised: where :func:`split_of` starts."""
    return {"start": clock.synchronize(), "totals": dict(clock.totals), "flops": clock.flops,
            "bytes": dict(clock.bytes_by_kind), "calls": dict(clock.calls_by_kind),
            "spans": len(clock.spans)}


def _since(now: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}
