"""ZeRO: shard the optimizer state, then the gradients, then the parameters.

Rajbhandari, Rasley, Ruwase & He 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models". Plain data parallelism keeps a full copy
of every model state on every rank; ZeRO splits them over the N
data-parallel ranks instead, rank r owning the r-th 1/N of every parameter.

* ``shards.py``: how a tensor is cut into N shards (padded when N does not divide it).
* ``sharded_optimizer.py``: stages 1 and 2, :class:`ShardedOptimizer`.
* ``fsdp.py``: stage 3, :class:`FullyShardedModel` (fully sharded data parallelism).
* ``experiments.py``: :func:`shard_model`, :func:`train_sharded`, :func:`held_bytes`,
  :func:`fsdp2_side_by_side`, what notebook 03 runs.

Every piece takes ``group=`` (default: the world), so a hybrid mesh can shard
over its data-parallel group alone.
"""
from .experiments import fsdp2_side_by_side, held_bytes, shard_model, train_sharded
from .fsdp import FullyShardedModel
from .sharded_optimizer import GRADIENT_MODES, ShardedOptimizer

__all__ = ["GRADIENT_MODES", "ShardedOptimizer", "FullyShardedModel", "shard_model",
           "held_bytes", "train_sharded", "fsdp2_side_by_side"]
