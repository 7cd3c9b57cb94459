"""Data parallelism: the wrappers (:mod:`.ddp`) and the experiments on them (:mod:`.experiments`).

``from lecture_lib.data_parallel import DDPBucketed, train_data_parallel`` and
``lecture_lib.data_parallel.X`` find every public name of both files.
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
from .experiments import Trainer, check_training_args, compare_variants, train_data_parallel

__all__ = ["VARIANTS", "DDPNaive", "DDPFlat", "DDPIndividualParameters", "DDPBucketed",
           "make_buckets", "wrap", "check_bucket_size", "Trainer", "check_training_args",
           "train_data_parallel", "compare_variants"]
