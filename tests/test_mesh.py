"""mesh: grid arithmetic and the real groups agree; bad grids fail before any process starts."""
import dataclasses

import pytest

import lecture_lib
from lecture_lib.comm import LOCAL
from lecture_lib.dims import ParallelDims, Recipe
from lecture_lib.mesh import RankGrid, check_grid, grid_coordinates, grid_groups


def test_coordinates_are_row_major_last_dim_fastest():
    dims = {"dp": 2, "pp": 2, "tp": 2}
    assert grid_coordinates(0, dims) == {"dp": 0, "pp": 0, "tp": 0}
    assert grid_coordinates(1, dims) == {"dp": 0, "pp": 0, "tp": 1}
    assert grid_coordinates(6, dims) == {"dp": 1, "pp": 1, "tp": 0}
    assert grid_groups(dims, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid_groups(dims, "dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_real_groups_match_the_arithmetic():
    dims = {"dp": 2, "tp": 2}

    def on_rank():
        grid = RankGrid(**dims)
        return grid.coords, grid.ranks("dp"), grid.ranks("tp"), grid.size("tp")

    for rank, (coords, dp, tp, tp_size) in enumerate(lecture_lib.run(on_rank, 4, timeout=60)):
        assert coords == grid_coordinates(rank, dims)
        assert dp in grid_groups(dims, "dp") and rank in dp
        assert tp in grid_groups(dims, "tp") and rank in tp
        assert tp_size == 2


@pytest.mark.parametrize("dims, match", [
    ({"dp": 2, "tp": 3}, "has 6 ranks but world_size is 4"),
    ({"dp": 0, "tp": 4}, "whole number"),
    ({}, "at least one"),
])
def test_bad_grids(dims, match):
    with pytest.raises(ValueError, match=match):
        check_grid(4, dims)


def test_a_rank_grid_of_the_wrong_size_fails_on_every_rank():
    with pytest.raises(lecture_lib.RankError, match="has 3 ranks but world_size is 2"):
        lecture_lib.run(lambda: RankGrid(dp=3), 2, timeout=60)


def test_cp_axis_sits_just_outside_tp_and_defaults_to_one():
    dims = ParallelDims(dp=2, cp=2, tp=2).sizes()
    assert list(dims) == ["dp", "pp", "cp", "tp"]
    no_cp = ParallelDims(dp=2, tp=2).sizes()                 # every axis, cp of size one
    assert no_cp == {"dp": 2, "pp": 1, "cp": 1, "tp": 2}
    for axis in ("dp", "tp"):                                # the same groups as without cp
        assert grid_groups(no_cp, axis) == grid_groups({"dp": 2, "pp": 1, "tp": 2}, axis)
    assert grid_coordinates(5, dims) == {"dp": 1, "pp": 0, "cp": 0, "tp": 1}
    assert grid_groups(dims, "cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid_groups({"dp": 2, "tp": 2}, "cp") == [[0], [1], [2], [3]]
    check_grid(8, dims)
    with pytest.raises(ValueError, match="has 8 ranks but world_size is 4"):
        check_grid(4, dims)
    with pytest.raises(KeyError):
        grid_groups({"dp": 2}, "ep")                  # only cp defaults to one


def test_real_cp_groups_match_the_arithmetic():
    def on_rank():
        with_cp, without = RankGrid.from_dims(ParallelDims(dp=2, cp=2)), RankGrid(dp=4)
        return (with_cp.coord("cp"), with_cp.ranks("cp"), without.size("cp"),
                without.coord("cp"), without.ranks("cp"), without.group("cp") == LOCAL)

    for rank, (coord, ranks, size, c0, alone, local) in enumerate(lecture_lib.run(on_rank, 4,
                                                                                  timeout=60)):
        assert coord == grid_coordinates(rank, {"dp": 2, "pp": 1, "cp": 2})["cp"]
        assert ranks in grid_groups({"dp": 2, "cp": 2}, "cp") and rank in ranks
        assert (size, c0, alone, local) == (1, 0, [rank], True)


def test_a_layout_builds_its_grid_with_every_axis_tp_fastest():
    dims = ParallelDims(dp=2, tp=2)

    def on_rank():
        grid = RankGrid.from_dims(dims)
        return grid.dims, grid.ranks("tp"), grid.ranks("dp"), grid.ranks("cp")

    for rank, (sizes, tp, dp, cp) in enumerate(lecture_lib.run(on_rank, 4, timeout=60)):
        assert sizes == {"dp": 2, "pp": 1, "cp": 1, "tp": 2}
        assert tp == [rank - rank % 2, rank - rank % 2 + 1] and dp == [rank % 2, rank % 2 + 2]
        assert cp == [rank]


@pytest.mark.parametrize("kwargs, match", [
    (dict(dp=0), "dp must be a whole number >= 1"),
    (dict(dp=2, ep=3), "ep=3 must divide dp=2"),
])
def test_bad_layouts_fail_with_the_layout_named(kwargs, match):
    with pytest.raises(ValueError, match=f"^parallel layout .*{match}"):
        ParallelDims(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(zero_stage=4), "zero_stage must be one of"),
    (dict(zero_stage=True), "zero_stage must be one of"),
    (dict(microbatches=0), "microbatches must be"),
    (dict(schedule=3), "schedule must be a name"),
])
def test_bad_recipes_fail_with_the_recipe_named(kwargs, match):
    with pytest.raises(ValueError, match=f"^recipe .*{match}"):
        Recipe(**kwargs)


def test_a_layout_checks_its_world_size_and_a_recipe_splits_a_batch():
    with pytest.raises(ValueError, match="has 4 ranks but world_size is 8"):
        ParallelDims(dp=2, tp=2).check(8)
    assert Recipe(microbatches=2).split(8, dp=2) == (2, 2)
    assert Recipe(microbatch_size=1).split(8, dp=2) == (4, 1)
    assert Recipe().split(8, dp=2) == (1, 4)
    with pytest.raises(ValueError, match="does not split over dp=3"):
        Recipe().split(8, dp=3)
    with pytest.raises(ValueError, match="are not the 4 sequences"):
        Recipe(microbatches=2, microbatch_size=1).split(8, dp=2)


def test_layout_and_recipe_are_apart():
    """The degrees in one small type, how a step runs in another; each says what it is."""
    layout = {f.name for f in dataclasses.fields(ParallelDims)}
    recipe = {f.name for f in dataclasses.fields(Recipe)}
    assert layout == {"dp", "tp", "pp", "cp", "ep"}
    assert recipe == {"microbatches", "microbatch_size", "schedule", "zero_stage",
                      "cp_layout", "cp_method"}
    assert ParallelDims(dp=2, tp=2).label() == "dp2 tp2 pp1 cp1"
    assert ParallelDims(dp=4, ep=2).label() == "dp4 tp1 pp1 cp1 ep2"
    assert Recipe(microbatches=4, zero_stage=1).label() == "m4 zero1"
    assert Recipe().label() == ""
