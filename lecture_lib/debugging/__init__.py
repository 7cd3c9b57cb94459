"""Debugging distributed training: is the wiring right, do the replicas agree, does it converge?

Most distributed-training bugs are silent: the job runs, the loss even falls,
but the replicas have drifted apart or the update is the wrong size. The
lecture's checklist ("common problems and debugging"), each a tool here:

1. **Communication sanity check** (:func:`check_communication`,
   :func:`comm_sanity_check`) and 2. **gradient consistency**
   (:func:`check_gradient_consistency`): :mod:`.consistency`.
3. **Hangs** (:func:`hang_report`, the planted :func:`skipped_collective`):
   :mod:`.hangs`.
4. **A whole step under the tools** (:func:`inspect_train_step`): replicas, update size
   and loss against one process: :mod:`.steps`.
5. **Convergence** (:func:`train_gpt`, :func:`sweep`): clipping, the linear
   scaling rule with warm-up, determinism: :mod:`.experiments`.

The bugs the tools must find are planted into the course's own DDP
(:mod:`.planted`: :func:`planted_ddp`, :func:`sync_gradients`).
"""
from .consistency import (
                          CommCheck,
                          Inconsistency,
                          assert_consistent,
                          check_communication,
                          check_gradient_consistency,
                          comm_sanity_check,
)
from .experiments import sweep, train_gpt
from .hangs import hang_report, short_paths, skipped_collective
from .planted import PlantedDDPFlat, PlantedDDPNaive, planted_ddp, sync_gradients
from .steps import StepReport, inspect_train_step

__all__ = ["CommCheck", "Inconsistency", "PlantedDDPFlat", "PlantedDDPNaive", "StepReport",
           "assert_consistent", "check_communication", "check_gradient_consistency",
           "comm_sanity_check", "hang_report", "inspect_train_step", "planted_ddp",
           "short_paths", "skipped_collective", "sweep", "sync_gradients", "train_gpt"]
