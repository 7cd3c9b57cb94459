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
    # BEGIN SOLUTION
    coords = {}
    for name in reversed(list(dims)):
        coords[name] = rank % dims[name]
        rank //= dims[name]
    return {name: coords[name] for name in dims}
    # END SOLUTION


def build_groups(dims: dict) -> dict:
    # BEGIN SOLUTION
    world, me = math.prod(dims.values()), dist.get_rank()
    mine = {}
    for name in dims:
        members = {}
        for rank in range(world):
            c = coordinates(rank, dims)
            key = tuple(v for k, v in c.items() if k != name)
            members.setdefault(key, []).append(rank)
        for ranks in members.values():
            group = dist.new_group(ranks)
            if me in ranks:
                mine[name] = group
    return mine
    # END SOLUTION
