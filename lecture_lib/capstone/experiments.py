"""What the capstone notebook runs: every strategy side by side on one model and one batch.

:func:`compare_strategies` trains the same GPT on the same token file with the same
global batch and data order under each strategy (:data:`DEFAULT_RUNS`, or the
caller's), one ``lecture_lib.run`` call each, with the communication recorder of
:mod:`lecture_lib.comm` on, and returns one row per run: losses, tokens/s, MFU,
the memory each rank held and peaked at, and the share of the step spent inside
recorded collectives. Time is real time on this machine, or with ``base.emulate`` the
virtual time of an emulated cluster (``time_kind``; there the share is the communication
stream's busy time, and the recorder stays off so that it does not serialise the streams);
pipeline sends and receives are counted as the
recorder's ``"send"`` kind (:func:`lecture_lib.hybrid.exchange_as_comm`); their time includes
the wait for the stage before, so a pipeline's share holds part of its bubble.
:func:`loss_gaps` gives each run's largest relative loss difference from a
reference run (the one-process run when the list has one).
:func:`resume_and_reshard` stops a run at a checkpoint and resumes it under other
layouts; :func:`kill_and_resume` kills a rank mid-step and calls again.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from ..dims import ParallelDims, Recipe
from ..progress import progress
from ..runtime import launch
from .report import measured_peak_flops
from .train import TrainConfig, check_config, train, train_on_rank

DEFAULT_RUNS = {
    "1 process": dict(strategy="ddp", dims=ParallelDims()),
    "ddp": dict(strategy="ddp", dims=ParallelDims(dp=2)),
    "zero1": dict(strategy="zero1", dims=ParallelDims(dp=2)),
    "zero2": dict(strategy="zero2", dims=ParallelDims(dp=2)),
    "fsdp": dict(strategy="fsdp", dims=ParallelDims(dp=2)),
    "tp": dict(strategy="tp", dims=ParallelDims(tp=2)),
    "pp": dict(strategy="pp", dims=ParallelDims(pp=2), recipe=Recipe(microbatches=2)),
    "cp": dict(strategy="cp", dims=ParallelDims(cp=2)),
    "3d": dict(strategy="3d", dims=ParallelDims(tp=2, pp=2), recipe=Recipe(microbatches=2)),
}
"""Name -> the layout, recipe and options of each run (the rest from the base config)."""


def _row(name: str, cfg: TrainConfig, results: list[dict]) -> dict:
    r0 = results[0]
    last = r0["log"][-1]
    shares = []
    for r in results:
        total = sum(r["step_seconds"])
        shares.append(r["comm_seconds"] / total if total > 0 and r["comm_seconds"] else 0.0)
    return {"name": name, "strategy": cfg.strategy, "grid": r0["grid"],
            "world_size": cfg.world_size, "losses": r0["losses"],
            "tokens_per_s": r0["tokens_per_s"],
            "step_seconds": statistics.median(r0["step_seconds"][1:] or r0["step_seconds"]),
            # MFU of the same median step as tokens_per_s (the log's MFU is of its last steps)
            "mfu": last["mfu"] * r0["tokens_per_s"] / last["tokens_per_s"],
            "peak_flops": r0["peak_flops"],
            "peak_bytes": last["peak_bytes"], "held": last["held"],
            "comm_share": shares, "comm_bytes": [r["comm_bytes"] for r in results],
            "comm_sent_bytes": [r["comm_sent_bytes"] for r in results],
            "comm": [r["comm"] for r in results], "val_losses": r0["val_losses"],
            "time_kind": r0.get("time_kind", "real")}


def compare_strategies(base: TrainConfig, runs: dict | None = None, only=None,
                       timeout: float = 600, show: str | None = None) -> list[dict]:
    """Train ``base`` under each run's strategy (``{name: {strategy, dims, recipe, ...}}``).

    Every run shares the model, tokens, global batch, steps, learning rate and data
    order of ``base``; a checkpoint folder is not used. Each row: ``name``,
    ``strategy``, ``grid``, ``world_size``, ``losses``, ``tokens_per_s``,
    ``step_seconds`` (median after the first), ``mfu`` (of that median step, against
    ``peak_flops``), ``peak_bytes`` and ``held``
    (per rank, at the last logged step), ``comm_share`` (per rank: recorded
    collective seconds over step seconds, pipeline sends included), ``comm_bytes``,
    ``comm_sent_bytes``, ``comm`` (per rank: ``CommLog.summary()``), ``val_losses``,
    ``time_kind``. ``only`` picks some of the runs by name. Without ``base.peak_flops``,
    one dense-matmul rate measured here first is every run's MFU denominator.
    """
    runs = DEFAULT_RUNS if runs is None else runs
    if only is not None:
        missing = [n for n in only if n not in runs]
        if missing:
            raise ValueError(f"no run named {missing}; the runs are {list(runs)}")
        runs = {n: runs[n] for n in only}
    if base.peak_flops is None and base.emulate is None:   # one MFU denominator for every run
        base = replace(base, peak_flops=measured_peak_flops(launch.device(), reps=20))
    configs = {}
    for name, options in runs.items():
        cfg = replace(base, checkpoint_dir=None, checkpoint_every=0, fail_at=None,
                      record_comm=base.emulate is None,
                      **{"dims": ParallelDims(), "recipe": Recipe(), **options})
        check_config(cfg)                       # every run's bad input before the first starts
        configs[name] = cfg
    rows = []
    for name in progress(list(configs), "train each strategy", show=show):
        cfg = configs[name]
        rows.append(_row(name, cfg, launch.run(train_on_rank, cfg.world_size, cfg,
                                               timeout=timeout)))
    return rows


def loss_gaps(rows: list[dict], reference: str = "1 process") -> dict:
    """``{name: largest |loss - reference loss| / reference loss}`` over the steps."""
    ref = next(r["losses"] for r in rows if r["name"] == reference)
    return {r["name"]: max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref)) for r in rows}


def _options(base: TrainConfig, options: dict, **changes) -> TrainConfig:
    return replace(base, **{"dims": ParallelDims(), "recipe": Recipe(), **options, **changes})


def resume_and_reshard(base: TrainConfig, folder, stop_at: int, save: dict,
                       resume: dict, timeout: float = 600) -> dict:
    """Stop a run at ``stop_at`` (a checkpoint in ``folder``), resume it under each layout.

    ``save`` and each value of ``resume`` (``{name: options}``) are run options as in
    :data:`DEFAULT_RUNS`; ``folder`` must hold no checkpoint yet. Returns
    ``uninterrupted`` (the saving layout's losses without a stop), ``before`` (the
    losses up to ``stop_at``), ``resumed`` (``{name: losses from stop_at on}``) and
    ``gaps`` (``{name: largest |resumed - uninterrupted| / uninterrupted}``; 0.0 is
    bit-exact).
    """
    if any(Path(folder).glob("step_*")):
        raise ValueError(f"{folder} already holds a checkpoint: give an empty folder")
    first = _options(base, save, checkpoint_dir=None, checkpoint_every=0, fail_at=None)
    for options in [save, *resume.values()]:
        check_config(_options(base, options))
    straight = train(first, timeout=timeout)["losses"]
    before = train(_options(base, save, steps=stop_at, checkpoint_dir=str(folder),
                            checkpoint_every=stop_at, fail_at=None), timeout=timeout)["losses"]
    resumed = {name: train(_options(base, options, checkpoint_dir=str(folder),
                                    checkpoint_every=0, fail_at=None),
                           timeout=timeout)["losses"] for name, options in resume.items()}
    gaps = {name: max((abs(a - b) / abs(b) for a, b in zip(losses, straight[stop_at:])),
                      default=0.0) for name, losses in resumed.items()}
    return {"uninterrupted": straight, "before": before, "resumed": resumed, "gaps": gaps}


def kill_and_resume(base: TrainConfig, folder, options: dict, fail_at: int, fail_rank: int,
                    every: int, timeout: float = 600) -> dict:
    """Kill rank ``fail_rank`` (SIGKILL) at step ``fail_at`` through ``lecture_lib.run``,
    checkpoints every ``every`` steps in ``folder``; then call again, which resumes.

    Returns ``error`` (the launcher's message naming the dead rank) and ``resumed``
    (the second call's result: ``first_step``, ``losses``, ...).
    """
    cfg = _options(base, options, checkpoint_dir=str(folder), checkpoint_every=every,
                   fail_at=fail_at, fail_rank=fail_rank)
    check_config(cfg)
    try:
        train(cfg, timeout=timeout)
    except launch.RankError as exc:
        error = str(exc)
    else:
        raise RuntimeError(f"rank {fail_rank} was to be killed at step {fail_at}, but the "
                           "run finished: is there already a marker or a later checkpoint?")
    return {"error": error, "resumed": train(cfg, timeout=timeout)}
