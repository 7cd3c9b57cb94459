# Generated from solutions/ex09_rank_grid.py by `python -m lecture_lib.grading stubs`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grading grade exercises/ex09_rank_grid.py
"""Exercise 09: the rank grid of 3-D parallelism.

With ``world_size = dp * tp * pp`` ranks, every rank has a coordinate along
each named dimension. Lay the ranks out row-major with the LAST dimension
fastest, so that for ``dims = {"dp": 2, "pp": 2, "tp": 2}`` ranks 0 and 1
differ only in tp (they form one tensor-parallel group, the pair to keep on
fast links inside a node), ranks 0 and 2 differ only in pp, and ranks 0 and 4
only in dp.

1. ``coordinates(rank, dims)``: this rank's coordinate along each dimension,
   as a dict in the order of ``dims``. Pure arithmetic: no communication.
2. ``build_groups(dims)``: called on every rank inside ``lecture_lib.run``;
   returns ``{name: process_group}`` holding, for each dimension, the group
   of ranks that differ from this rank only along that dimension.

Hint for 2: ``dist.new_group(ranks)`` must be called by EVERY rank, for EVERY
group, in the same order (even for groups the rank is not in); keep the one
that contains this rank.
"""
import math

import torch.distributed as dist


def coordinates(rank: int, dims: dict) -> dict:
    raise NotImplementedError("ex09: your code here")


def build_groups(dims: dict) -> dict:
    raise NotImplementedError("ex09: your code here")
