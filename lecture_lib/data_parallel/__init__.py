"""Data parallelism: the wrappers (:mod:`.ddp`) and the experiments on them.

The package exports the algorithm, the wrappers of :mod:`.ddp`
(``from lecture_lib.data_parallel import DDPBucketed``). The experiments are
imported by their module, so that using a wrapper imports neither them nor the
emulation: :mod:`.experiments` trains and times the wrappers in real time
(notebook 02, ``from lecture_lib.data_parallel import experiments as dpx``);
:mod:`.emulated` runs the same wrappers on an emulated GPU cluster
(:mod:`lecture_lib.emulate`) and splits the step in virtual time (notebook 02),
on the course's small GPT or, in the dry run, at real size
(:func:`~lecture_lib.data_parallel.emulated.time_at_scale`: GPT-2 on 8 H100s).
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

__all__ = ["VARIANTS", "DDPNaive", "DDPFlat", "DDPIndividualParameters", "DDPBucketed",
           "make_buckets", "wrap", "check_bucket_size"]
