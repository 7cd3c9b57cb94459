# shortcut: the ranks laid out with the FIRST dimension fastest (column-major), groups to match
# graded as: ex09_rank_grid.py
# scores: at most 3
# message: expected
import math

import torch.distributed as dist


def coordinates(rank: int, dims: dict) -> dict:
    coords = {}
    for name in dims:
        coords[name] = rank % dims[name]
        rank //= dims[name]
    return coords


def build_groups(dims: dict) -> dict:
    world, me, mine = math.prod(dims.values()), dist.get_rank(), {}
    for name in dims:
        members = {}
        for rank in range(world):
            key = tuple(v for k, v in coordinates(rank, dims).items() if k != name)
            members.setdefault(key, []).append(rank)
        for ranks in members.values():
            group = dist.new_group(ranks)
            if me in ranks:
                mine[name] = group
    return mine
