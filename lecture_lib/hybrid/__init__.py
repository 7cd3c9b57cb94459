"""Hybrid parallelism: every scheme on its own axis of one rank grid (Narayanan et al. 2021).

:mod:`.gpt` is the lecture: a layout and a recipe applied to a GPT in one fixed
order, and the training step every rank runs. :mod:`.experiments` trains small models
with it (equal to one process) and times real-size ones in the emulation's dry run.
"""
from .experiments import (
    PHASES,
    build,
    emulated_steps,
    job_step,
    merge_ranks,
    rank_batch,
    step_seconds,
    time_at_scale,
    train_hybrid,
    train_on_rank,
)
from .gpt import (
    RankModel,
    apply_context_parallel,
    apply_data_parallel,
    apply_sharded_data_parallel,
    apply_tensor_parallel,
    check_hybrid,
    exchange_as_comm,
    parallelize,
)

__all__ = ["PHASES", "build", "emulated_steps", "merge_ranks", "rank_batch", "step_seconds",
           "job_step", "time_at_scale", "train_hybrid", "train_on_rank", "RankModel",
           "apply_context_parallel", "apply_data_parallel", "apply_sharded_data_parallel",
           "apply_tensor_parallel", "check_hybrid", "exchange_as_comm", "parallelize"]
