"""ZeRO: shard the optimizer state, then the gradients, then the parameters.

Rajbhandari, Rasley, Ruwase & He 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models". Plain data parallelism keeps a full copy
of every model state on every rank; ZeRO splits them over the N
data-parallel ranks instead, rank r owning the r-th 1/N of every parameter.

* ``shards.py``: how a tensor is cut into N shards, and many packed into one collective.
* ``sharded_optimizer.py``: stage 1, :class:`ShardedOptimizer`; stage 2,
  :class:`ShardedGradientOptimizer`.
* ``fsdp.py``: stage 3, :class:`FullyShardedModel` (fully sharded data parallelism):
  the hooks that decide when each unit gathers, computes, frees and reduce-scatters;
  ``units.py``: one unit's life (each transition); ``wrap.py``: which submodules
  are units (the wrap policy) and their parameters made shards.
* ``fsdp_api.py``: CS336's interface (``get_fsdp``, ``fsdp_on_after_backward``,
  ``fsdp_gather_full_params``) and per-rank sharded checkpoints.
* ``experiments.py``: ``shard_model``, ``train_sharded``, ``held_bytes``,
  ``train_fsdp``, ``fsdp2_side_by_side``, what notebook 03b runs;
  ``fsdp_experiments.py``: bytes sent per step, memory with and without resharding,
  prefetch timelines in real and emulated time; ``emulated.py``: every stage's step
  time and its split, on a small model or, in the dry run, at real size (``time_at_scale``).
  They are imported by their module (``from lecture_lib.zero import experiments as zerox,
  fsdp_experiments as fsdpx``): the package exports only the algorithm, so that building
  a :class:`ShardedOptimizer` imports neither them nor the emulation.
  Which rank holds what, moment by moment, is drawn in
  :mod:`lecture_lib.figures.pictures.zero_shards` (drawing sits above the algorithms).

Every piece takes ``group=`` (default: the world), so a hybrid mesh can shard
over its data-parallel group alone.
"""
from .fsdp import FullyShardedModel
from .fsdp_api import (
    fsdp_gather_full_params,
    fsdp_on_after_backward,
    get_fsdp,
    load_sharded,
    save_sharded,
)
from .sharded_optimizer import GRADIENT_MODES, ShardedGradientOptimizer, ShardedOptimizer
from .wrap import check_fsdp, default_policy, resolve_units

__all__ = ["GRADIENT_MODES", "ShardedOptimizer", "ShardedGradientOptimizer",
           "FullyShardedModel", "check_fsdp", "get_fsdp", "fsdp_on_after_backward",
           "fsdp_gather_full_params", "save_sharded", "load_sharded", "default_policy",
           "resolve_units"]
