"""Data parallelism on an emulated cluster: DDP's step time, its overlap, what emulating costs.

:func:`ddp_step` (a rank function) trains the course's GPT with one of the
course's data-parallel wrappers under the emulation and splits each step's
emulated time into forward, backward, communication and optimizer, with the
timeline of the last step and, per bucket, when its gradients were ready and
its bytes (exercise 14 predicts the step from them). :func:`measure_ddp` runs
it on fresh ranks for several variants and bucket sizes; :func:`measure_weak_scaling`
runs bucketed DDP on 1, 2, 4, ... ranks with the tokens per rank fixed (weak
scaling: the ideal is a throughput proportional to the ranks).
:func:`emulation_overhead` measures what the emulation costs in *real* time:
the same steps with and without it, alternated on the same ranks.
:func:`time_at_scale` runs :func:`ddp_step` in the dry run (fake tensors) on a model
of real size, GPT-2 small or medium on 8 emulated GPUs, for any variant, bucket
size and number of accumulated micro-batches: the same code, and the same clock,
as on the small model (``tests/test_data_parallel_emulated.py``).

The step-time model the figures are read against (Li et al. 2020, "PyTorch
Distributed", section 3.2.3; the bucketed all-reduce overlaps with the rest
of backward, the last bucket cannot):

    T_step ~= T_fwd + max(T_bwd, T_comm - T_last) + T_last + T_opt
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

from .. import emulate
from ..comm import group_info
from ..emulate import Clock, emulated
from ..models import GPT, GPTConfig, lm_loss, make_optimizer
from ..progress import progress
from ..runtime import launch
from .ddp import check_bucket_size, wrap

# the course's own wrappers (:func:`~lecture_lib.data_parallel.ddp.wrap`) whose step the
# emulation splits into phases
EMULATED_VARIANTS = ("flat", "individual", "bucketed")
PHASES = ("forward", "backward", "comm", "optimizer")   # what the clock's totals split into


def _check(variant: str, cfg: GPTConfig, batch_per_rank: int, steps: int,
           accumulation: int = 1) -> None:
    if variant not in EMULATED_VARIANTS:
        raise ValueError(f"variant must be one of {EMULATED_VARIANTS}, not {variant!r}")
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"cfg must be a GPTConfig, not {type(cfg).__name__}")
    for name, value in (("accumulation", accumulation), ("batch_per_rank", batch_per_rank),
                        ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
    if batch_per_rank % accumulation:
        raise ValueError(f"batch_per_rank={batch_per_rank} does not split into "
                         f"{accumulation} micro-batches")


def ddp_step(variant: str, cfg: GPTConfig, batch_per_rank: int, steps: int = 2,
             bucket_size_mb: float | None = None, preset="h100-node", group=None, *,
             accumulation: int = 1, optimizer: str = "sgd", dry_run: bool = False) -> dict:
    """Rank function: ``steps`` emulated DDP steps over ``group`` (default: the world); the
    split of the last (emulated seconds), and everything the clock knows (``"clock"``).

    Each step trains ``batch_per_rank`` sequences in ``accumulation`` micro-batches, all
    but the last backward inside ``no_sync()``. ``dry_run=True``: on fake tensors (a model
    of real size in seconds), reading the same clock as on real tensors.
    """
    _check(variant, cfg, batch_per_rank, steps, accumulation)
    with emulated(preset, dry_run=dry_run) as clock:
        model = GPT(cfg, seed=0)
        wrapped = wrap(variant, model, bucket_size_mb, group)
        opt = make_optimizer(model.parameters(), optimizer, 0.1)
        split = _train_steps(wrapped, opt, cfg, batch_per_rank, steps, clock, group,
                             accumulation)
    n = sum(p.numel() for p in model.parameters())
    buckets = getattr(wrapped, "buckets", None)           # bucketed: in launch order
    planned = None if buckets is None else [sum(p.numel() * p.element_size() for p in b)
                                            for b in buckets]
    return {**split, "variant": variant, "bucket_size_mb": bucket_size_mb, "params": n,
            "grad_bytes": 4 * n, "tokens_per_rank": batch_per_rank * cfg.seq_len,
            "accumulation": accumulation, "samples_per_rank": batch_per_rank,
            # the bytes of the all-reduces issued; where none was (one rank), the buckets'
            "bucket_bytes": split.get("bucket_bytes") or planned,
            "clock": {**clock.summary(), "issued": list(clock.issued)}}


def _train_steps(wrapped, opt, cfg, batch_per_rank, steps, clock: Clock | None, group=None,
                 accumulation: int = 1) -> dict:
    """``steps`` data-parallel steps; under ``clock``, the emulated split of the last one."""
    phase = clock.phase if clock is not None else (lambda kind: nullcontext())
    split = {}
    for step in range(steps):
        x, y = _tokens(cfg, batch_per_rank, step, group_info(group)[0])
        if clock is not None:
            start, totals, first_span = clock.synchronize(), dict(clock.totals), len(clock.spans)
            first_issue = len(clock.issued)
        wrapped.on_train_batch_start()
        opt.zero_grad(set_to_none=True)
        micro = list(zip(x.chunk(accumulation), y.chunk(accumulation)))
        for i, (mx, my) in enumerate(micro):
            last = i == len(micro) - 1          # only the last backward synchronises
            with nullcontext() if last else wrapped.no_sync():
                with phase("forward"):
                    loss = lm_loss(wrapped(mx), my)
                    if accumulation > 1:
                        loss = loss / accumulation
                with phase("backward"):
                    loss.backward()
        with phase("backward"):
            wrapped.finish_gradient_synchronization()
        with phase("optimizer"):
            opt.step()
        if clock is not None:
            split = _split(clock, start, totals, first_span, first_issue)
    return split


def _split(clock: Clock, start, totals, first_span, first_issue) -> dict:
    """The emulated split of the step that started at ``start`` (see :func:`time_at_scale`)."""
    end = clock.synchronize()
    delta = {k: v - totals.get(k, 0.0) for k, v in clock.totals.items()}
    spans = [(k, s - start, e - start, t) for k, s, e, t in clock.spans[first_span:]]
    comm = [s for s in spans if s[0] == "comm"]
    split = {"step": end - start, **{k: delta.get(k, 0.0) for k in PHASES}}
    waits = sum(min(b, end) - max(a, start) for a, b in clock.launch_waits
                if b > start and a < end)
    return {**split, "exposed": split["step"] - sum(split[k] for k in PHASES if k != "comm"),
            "launch_waits": waits,
            "last_bucket": comm[-1][2] - comm[-1][1] if comm else 0.0,
            "collectives": len(comm), "spans": spans,
            **_buckets(clock.issued[first_issue:], start)}


def _tokens(cfg: GPTConfig, batch: int, step: int, rank: int):
    """This rank's ``(inputs, targets)`` of step ``step``: random tokens, one kernel (the
    emulated time depends on shapes only; a dry run makes them fake)."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    seq = torch.randint(cfg.vocab_size, (batch, cfg.seq_len + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def _buckets(issued, start) -> dict:
    """Per gradient all-reduce of the step (one per bucket): when its gradients were ready
    (the compute stream's time at issue, from the step's start) and its bytes."""
    mine = [(t - start, n) for kind, t, n in issued if kind == "all_reduce"]
    return {"bucket_ready": [t for t, _ in mine], "bucket_bytes": [n for _, n in mine]}


def measure_ddp(configs: list[dict], world_size: int, cfg: GPTConfig, batch_per_rank: int,
                steps: int = 2, preset="h100-node", timeout: float = 300.0) -> list[dict]:
    """Rank 0's :func:`ddp_step` for each ``{"variant": ..., "bucket_size_mb": ...}``
    (one call of the ranks per configuration, with :func:`~lecture_lib.progress.progress`)."""
    for c in configs:
        _check(c["variant"], cfg, batch_per_rank, steps)
    return [launch.run(ddp_step, world_size, c["variant"], cfg, batch_per_rank, steps,
                       c.get("bucket_size_mb"), preset, timeout=timeout)[0]
            for c in progress(list(configs), f"emulated DDP: one configuration on {world_size} "
                              "ranks each")]


def time_at_scale(cfg: GPTConfig, configs: list[dict], world_size: int = 8,
                  micro_batch: int = 8, preset="h100-node", optimizer: str = "adamw",
                  timeout: float = 300.0, steps: int = 2) -> list[dict]:
    """DDP at real size in the dry run: rank 0's :func:`ddp_step` (the last of ``steps`` steps
    on fake tensors: by default the second, since the first also creates AdamW's moments) for
    each ``{"variant", "bucket_size_mb", "accumulation"}`` on ``world_size`` GPUs.

    Each rank trains ``accumulation`` (default 1) micro-batches of ``micro_batch``
    sequences per step, so accumulation changes the samples per all-reduce, not the
    micro-batch. All checked before any process starts. Each row adds ``wall_s`` (real
    seconds of the call, starting the ranks included), ``comm_per_sample`` (seconds on the
    communication stream per sequence of the step, all ranks' sequences), ``preset`` (its
    label) and the configuration. The split: ``step`` = ``forward`` + ``backward`` +
    ``optimizer`` (the compute stream's phases, its waits for kernel launches included:
    ``launch_waits`` of them) + ``exposed`` (waiting for all-reduces); ``comm`` is the
    communication stream's time, hidden or not.
    """
    cluster = emulate.preset(preset)
    runs = []
    for c in configs:
        unknown = set(c) - {"variant", "bucket_size_mb", "accumulation"}
        if unknown:
            raise ValueError(f"config {c}: unknown keys {sorted(unknown)}")
        runs.append((c["variant"], c.get("bucket_size_mb"), c.get("accumulation", 1)))
        _check(runs[-1][0], cfg, micro_batch * runs[-1][2], steps, runs[-1][2])
        check_bucket_size(runs[-1][1])
    rows = []
    for variant, mb, k in progress(runs, f"DDP at real size, dry run on {world_size} ranks: "
                                   "one configuration each"):
        start = time.perf_counter()
        r = launch.run(ddp_step, world_size, variant, cfg, micro_batch * k, steps, mb, cluster,
                       accumulation=k, optimizer=optimizer, dry_run=True, timeout=timeout)[0]
        r.pop("clock")
        rows.append({**r, "world_size": world_size, "preset": emulate.label(cluster),
                     "comm_per_sample": r["comm"] / (world_size * r["samples_per_rank"]),
                     "wall_s": time.perf_counter() - start})
    return rows


def _scaling_rank(world_sizes, cfg, batch_per_rank, steps, bucket_size_mb, preset):
    """Rank function on ``max(world_sizes)`` ranks: for each ``p``, :func:`ddp_step` on a
    group of the first ``p`` ranks (the others wait); rank 0's rows."""
    rows = []
    for p in world_sizes:
        group = dist.new_group(list(range(p)))           # every rank makes every group
        if dist.get_rank() < p:
            rows.append(ddp_step("bucketed", cfg, batch_per_rank, steps, bucket_size_mb,
                                 preset, group))
            dist.destroy_process_group(group)
    return rows


def measure_weak_scaling(world_sizes, cfg: GPTConfig, batch_per_rank: int,
                         bucket_size_mb: float | None, steps: int = 1, preset="h100-node",
                         timeout: float = 300.0) -> list[dict]:
    """Bucketed DDP with ``batch_per_rank`` sequences per rank on each of ``world_sizes``.

    One call of ``max(world_sizes)`` ranks; world size ``p`` runs on a group of
    the first ``p`` ranks, all in one node of the preset when ``p`` fits in it
    (emulated time does not see the idle ranks). One row per world size, rank
    0's :func:`ddp_step` (the emulated split, its ``bucket_bytes``), with
    ``world_size`` and ``tokens_per_s`` (all ranks' tokens over the emulated
    step) added. Checked before any process starts.
    """
    sizes = list(world_sizes) if isinstance(world_sizes, (list, tuple, range)) else None
    if not sizes or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in sizes):
        raise ValueError(f"world_sizes must be a non-empty list of whole numbers >= 1, "
                         f"not {world_sizes!r}")
    _check("bucketed", cfg, batch_per_rank, steps)
    check_bucket_size(bucket_size_mb)
    rows = launch.run(_scaling_rank, max(sizes), sizes, cfg, batch_per_rank, steps,
                      bucket_size_mb, preset, timeout=timeout)[0]
    return [{**row, "world_size": p, "tokens_per_s": p * row["tokens_per_rank"] / row["step"]}
            for p, row in zip(sizes, rows)]


def _overhead_rank(variant, cfg, batch_per_rank, steps, bucket_size_mb, preset, repeats):
    model = GPT(cfg, seed=0)
    wrapped = wrap(variant, model, bucket_size_mb)
    opt = make_optimizer(model.parameters(), "sgd", 0.1)
    _train_steps(wrapped, opt, cfg, batch_per_rank, 1, None)              # warm-up
    plain, emul = [], []
    for _ in range(repeats):
        dist.barrier()
        t = time.perf_counter()
        _train_steps(wrapped, opt, cfg, batch_per_rank, steps, None)
        plain.append(time.perf_counter() - t)
        dist.barrier()
        t = time.perf_counter()
        with emulated(preset) as clock:
            _train_steps(wrapped, opt, cfg, batch_per_rank, steps, clock)
        emul.append(time.perf_counter() - t)
    return {"plain_s": min(plain), "emulated_s": min(emul), "ratio": min(emul) / min(plain)}


def emulation_overhead(variant: str, world_size: int, cfg: GPTConfig, batch_per_rank: int,
                       steps: int = 3, bucket_size_mb: float | None = None,
                       preset="h100-node", repeats: int = 3, timeout: float = 300.0) -> dict:
    """Real seconds of ``steps`` DDP steps without and with the emulation (fastest of
    ``repeats``, alternated), and their ratio; rank 0's figures."""
    _check(variant, cfg, batch_per_rank, steps)
    return launch.run(_overhead_rank, world_size, variant, cfg, batch_per_rank, steps,
                      bucket_size_mb, preset, repeats, timeout=timeout)[0]
