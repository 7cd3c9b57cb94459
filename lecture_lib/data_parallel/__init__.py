"""Data parallelism: the wrappers (:mod:`.ddp`) and the experiments on them.

:mod:`.experiments` trains and times them in real time (notebook 02);
:mod:`.emulated` runs the same wrappers on an emulated GPU cluster
(:mod:`lecture_lib.emulate`) and splits the step in virtual time (notebook 02b).
``from lecture_lib.data_parallel import DDPBucketed, train_data_parallel`` and
``lecture_lib.data_parallel.X`` find every public name of the three files.
"""
from .ddp import (
    VARIANTS,
    DDPBucketed,
    DDPFlat,
    DDPIndividualParameters,
    DDPNaive,
    check_bucket_size,
    make_buckets,
    wrap,
)
from .emulated import (
    EMULATED_VARIANTS,
    ddp_step,
    emulation_overhead,
    measure_ddp,
    measure_weak_scaling,
)
from .experiments import Trainer, check_training_args, compare_variants, train_data_parallel

__all__ = ["VARIANTS", "DDPNaive", "DDPFlat", "DDPIndividualParameters", "DDPBucketed",
           "make_buckets", "wrap", "check_bucket_size", "Trainer", "check_training_args",
           "train_data_parallel", "compare_variants", "EMULATED_VARIANTS", "ddp_step",
           "measure_ddp", "measure_weak_scaling", "emulation_overhead"]
