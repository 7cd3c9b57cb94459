"""ex09: rank coordinates and the dp/tp/pp process groups of a grid.

Weights: the groups (on 2-D and on 3-D grids, the statement's kind) carry most of the points;
the coordinates are checked on the statement's grid, on small ones, and on random grids it
does not show (a table of the example cannot pass them)."""
import math
import random

import pytest
import torch
import torch.distributed as dist

from lecture_lib.grading import load_exercise
from lecture_lib.mesh import grid_coordinates, grid_groups

ex = load_exercise("ex09")
POINTS = 10

GRIDS = [{"dp": 2, "pp": 2, "tp": 2}, {"dp": 4, "tp": 1}, {"pp": 3, "tp": 2}, {"dp": 1}]


def _check_coordinates(dims):
    for rank in range(math.prod(dims.values())):
        got = ex.coordinates(rank, dims)
        want = grid_coordinates(rank, dims)
        assert got == want, (f"rank {rank} of {dims}: expected {want}, got {got} (row-major, "
                             "the last dimension fastest)")
        assert list(got) == list(dims), "keep the order of dims"


@pytest.mark.weight(0.5)
@pytest.mark.parametrize("dims", GRIDS, ids=str)
def test_coordinates(dims):
    _check_coordinates(dims)


@pytest.mark.weight(1.5)
def test_coordinates_of_random_grids():
    """Grids the statement does not show: 2 to 4 dimensions, any names, in any order."""
    rng = random.Random(9)
    for _ in range(8):
        names = rng.sample(["dp", "pp", "tp", "cp", "ep"], rng.randint(2, 4))
        _check_coordinates({name: rng.randint(1, 4) for name in names})


def _members(dims):
    groups = ex.build_groups(dims)
    out = {}
    for name, group in groups.items():
        # who is in my group? every member contributes 2**rank; the sum names the set
        t = torch.tensor([2 ** dist.get_rank()], dtype=torch.int64)
        dist.all_reduce(t, group=group)
        out[name] = sorted(r for r in range(dist.get_world_size()) if t.item() >> r & 1)
    return out


def _check_groups(dims):
    results = ex.run(_members, math.prod(dims.values()), dims, timeout=90)
    for rank, members in enumerate(results):
        assert set(members) == set(dims), \
            f"rank {rank}: groups for {sorted(members)}, want {sorted(dims)}"
        for name in dims:
            want = next(g for g in grid_groups(dims, name) if rank in g)
            assert members[name] == want, (
                f"rank {rank} of {dims}: its {name} group should hold ranks {want} (those "
                f"that differ from it only in {name}), got {members[name]}")


@pytest.mark.parametrize("dims", [{"dp": 2, "tp": 2}, {"dp": 2, "pp": 2}, {"pp": 2, "tp": 2}],
                         ids=str)
def test_groups_on_four_ranks(dims):
    _check_groups(dims)


@pytest.mark.weight(2.5)
@pytest.mark.parametrize("dims", [{"pp": 2, "dp": 2, "tp": 2}, {"dp": 2, "pp": 1, "tp": 2}],
                         ids=str)
def test_groups_on_a_3d_grid(dims):
    """Three dimensions, as in the statement: the middle one's groups are neither blocks of
    consecutive ranks nor all the ranks that share the last coordinate."""
    _check_groups(dims)
