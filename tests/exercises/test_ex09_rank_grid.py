"""ex09: rank coordinates and the dp/tp/pp process groups of a grid."""
import math

import pytest
import torch
import torch.distributed as dist

from lecture_lib.grading import load_exercise
from lecture_lib.mesh import grid_coordinates, grid_groups

ex = load_exercise("ex09")
POINTS = 10

GRIDS = [{"dp": 2, "pp": 2, "tp": 2}, {"dp": 4, "tp": 1}, {"pp": 3, "tp": 2}, {"dp": 1}]


@pytest.mark.parametrize("dims", GRIDS, ids=str)
def test_coordinates(dims):
    for rank in range(math.prod(dims.values())):
        got = ex.coordinates(rank, dims)
        want = grid_coordinates(rank, dims)
        assert got == want, f"rank {rank} of {dims}: expected {want}, got {got}"
        assert list(got) == list(dims), "keep the order of dims"


def _members(dims):
    groups = ex.build_groups(dims)
    out = {}
    for name, group in groups.items():
        # who is in my group? every member contributes 2**rank; the sum names the set
        t = torch.tensor([2 ** dist.get_rank()], dtype=torch.int64)
        dist.all_reduce(t, group=group)
        out[name] = sorted(r for r in range(dist.get_world_size()) if t.item() >> r & 1)
    return out


@pytest.mark.parametrize("dims", [{"dp": 2, "tp": 2}, {"dp": 2, "pp": 2}, {"pp": 2, "tp": 2}],
                         ids=str)
def test_groups_on_four_ranks(dims):
    results = ex.run(_members, 4, dims, timeout=60)
    for rank, members in enumerate(results):
        assert set(members) == set(dims), \
            f"rank {rank}: groups for {sorted(members)}, want {sorted(dims)}"
        for name in dims:
            want = next(g for g in grid_groups(dims, name) if rank in g)
            assert members[name] == want, \
                f"rank {rank}: its {name} group should hold ranks {want}, got {members[name]}"
