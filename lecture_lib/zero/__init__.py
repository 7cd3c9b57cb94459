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
* ``experiments.py``: :func:`shard_model`, :func:`train_sharded`, :func:`held_bytes`,
  :func:`train_fsdp`, :func:`fsdp2_side_by_side`, what notebook 03 runs;
  ``fsdp_experiments.py``: bytes sent per step, memory with and without resharding,
  prefetch timelines in real and emulated time, every stage's emulated step time;
  ``picture.py``: which rank holds what, moment by moment.

Every piece takes ``group=`` (default: the world), so a hybrid mesh can shard
over its data-parallel group alone.
"""
from .experiments import (
    data_parallel_steps,
    fsdp2_side_by_side,
    held_bytes,
    shard_model,
    train_fsdp,
    train_fsdp2,
    train_sharded,
)
from .fsdp import FullyShardedModel, check_fsdp
from .fsdp_api import (
    fsdp_gather_full_params,
    fsdp_on_after_backward,
    get_fsdp,
    load_sharded,
    save_sharded,
)
from .fsdp_experiments import (
    event_spans,
    fsdp_timeline,
    fsdp_timeline_emulated,
    measure_comm_volume,
    measure_fsdp_memory,
    measure_step_time_emulated,
    overlapped_seconds,
)
from .picture import plot_shard_states, shard_states
from .sharded_optimizer import GRADIENT_MODES, ShardedOptimizer
from .units import default_policy, resolve_units

__all__ = ["GRADIENT_MODES", "ShardedOptimizer", "FullyShardedModel", "check_fsdp",
           "get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params", "save_sharded",
           "load_sharded", "default_policy", "resolve_units", "shard_model", "held_bytes",
           "data_parallel_steps", "train_sharded", "train_fsdp", "train_fsdp2",
           "fsdp2_side_by_side", "measure_comm_volume", "measure_fsdp_memory",
           "measure_step_time_emulated", "fsdp_timeline", "fsdp_timeline_emulated",
           "event_spans", "overlapped_seconds",
           "shard_states", "plot_shard_states"]
