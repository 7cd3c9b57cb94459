"""ex01: ring all-reduce from send/recv. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file."""
import pytest
import torch
import torch.distributed as dist

from lecture_lib.grading import assert_close_per_rank, load_exercise

ex = load_exercise("ex01")
POINTS = 10
COLLECTIVES = ("all_reduce", "reduce", "all_gather", "broadcast", "reduce_scatter",
               "all_to_all", "gather", "scatter", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_gather_single", "reduce_scatter_single")


def _on_rank(numels):
    def forbidden(*args, **kwargs):
        raise AssertionError("use send/recv only, not a collective")
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    try:                                         # this rank, this call only: the warm
        for name in saved:                       # worker process serves later calls
            setattr(dist, name, forbidden)
        return [_one_size(n) for n in numels]
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _input(numel, rank):
    return torch.arange(numel, dtype=torch.float32) * 7 % 5 + 10 * rank


def _one_size(numel):
    rank, p = dist.get_rank(), dist.get_world_size()
    x = _input(numel, rank)
    out = ex.ring_all_reduce(x)
    # the two halves on their own, on chunks of a flat buffer
    flat = x.clone()
    chunks = list(torch.tensor_split(flat, p))
    ex.reduce_scatter_(chunks)
    mine = chunks[rank].clone()
    ex.all_gather_(chunks)
    return {"out": out, "input": x, "mine": mine, "gathered": flat}   # verdicts: in the test


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_rank_gets_the_sum_for_any_size(world_size):
    numels = (12, 7, 2)                          # divisible, not divisible, fewer than ranks
    per_rank = ex.run(_on_rank, world_size, numels, timeout=60)
    for i, numel in enumerate(numels):
        results = [r[i] for r in per_rank]
        total = sum(_input(numel, r) for r in range(world_size))
        chunks = list(torch.tensor_split(total, world_size))
        where = f"{world_size} ranks, {numel} elements"
        assert_close_per_rank([r["out"] for r in results], total, f"ring_all_reduce ({where})")
        for rank, res in enumerate(results):
            assert torch.equal(res["input"], _input(numel, rank)), \
                f"ring_all_reduce changed its input (rank {rank}, {where})"
        assert_close_per_rank([r["mine"] for r in results], chunks,
                              f"after reduce_scatter_, chunks[rank] ({where})")
        assert_close_per_rank([r["gathered"] for r in results], total,
                              f"after all_gather_ ({where})")


def test_shape_is_kept():
    out = ex.run(lambda: ex.ring_all_reduce(torch.ones(2, 3, 4)), 3, timeout=60)
    assert all(o.shape == (2, 3, 4) and torch.all(o == 3) for o in out)
