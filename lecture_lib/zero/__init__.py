"""ZeRO: shard the optimizer state, then the gradients, then the parameters.

Rajbhandari, Rasley, Ruwase & He 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models". Plain data parallelism keeps a full copy
of every model state on every rank; ZeRO splits them over the N
data-parallel ranks instead, rank r owning the r-th 1/N of every parameter.

* ``shards.py``: how a tensor is cut into N shards (padded when N does not divide it).
* ``sharded_optimizer.py``: stages 1 and 2, :class:`ShardedOptimizer`.
* ``units.py``: FSDP's wrap policy (which submodules are gathered together).
* ``fsdp.py``: stage 3, :class:`FullyShardedModel` (fully sharded data parallelism):
  parameters are the shards, a compute dtype, prefetching, resharding.
* ``fsdp_api.py``: CS336's interface (``get_fsdp``, ``fsdp_on_after_backward``,
  ``fsdp_gather_full_params``) and per-rank sharded checkpoints.
* ``experiments.py``: ``shard_model``, ``train_sharded``, ``held_bytes``,
  ``train_fsdp``, ``fsdp2_side_by_side``, what notebook 03 runs;
  ``fsdp_experiments.py``: bytes sent per step, memory with and without resharding,
  prefetch timelines in real and emulated time, every stage's emulated step time.
  Both are imported by their module (``from lecture_lib.zero import experiments as zerox,
  fsdp_experiments as fsdpx``): the package exports only the algorithm, so that building
  a :class:`ShardedOptimizer` imports neither them nor the emulation.
  Which rank holds what, moment by moment, is drawn in
  :mod:`lecture_lib.figures.pictures.zero_shards` (drawing sits above the algorithms).

Every piece takes ``group=`` (default: the world), so a hybrid mesh can shard
over its data-parallel group alone.
"""
from .fsdp import FullyShardedModel, check_fsdp
from .fsdp_api import (
    fsdp_gather_full_params,
    fsdp_on_after_backward,
    get_fsdp,
    load_sharded,
    save_sharded,
)
from .sharded_optimizer import GRADIENT_MODES, ShardedOptimizer
from .units import default_policy, resolve_units

__all__ = ["GRADIENT_MODES", "ShardedOptimizer", "FullyShardedModel", "check_fsdp",
           "get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params", "save_sharded",
           "load_sharded", "default_policy", "resolve_units"]
