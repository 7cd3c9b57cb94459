"""ex01: ring all-reduce from send/recv. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file."""
import pytest
import torch
import torch.distributed as dist

from lecture_lib import RankError
from lecture_lib.grading import assert_close_per_rank, load_exercise

ex = load_exercise("ex01")
POINTS = 10
# A correct ring finishes in well under a second; a deadlock ends here with every rank's stack.
TIMEOUT = 15
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


def _run(fn, world_size, *args):
    """The ranks' results; gloo's obscure error for a message to oneself, said plainly."""
    try:
        return ex.run(fn, world_size, *args, timeout=TIMEOUT)
    except RankError as err:
        if "Pair is not connected" not in str(err):
            raise
        raise AssertionError(
            f"with {world_size} rank(s), a rank sent a message to itself or received one from "
            "itself (gloo: 'Pair is not connected'). How many steps does each ring take when "
            "there is one rank?\n\n" + str(err)) from None


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_rank_gets_the_sum_for_any_size(world_size):
    numels = (12, 7, 2)                          # divisible, not divisible, fewer than ranks
    per_rank = _run(_on_rank, world_size, numels)
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
    out = _run(lambda: ex.ring_all_reduce(torch.ones(2, 3, 4)), 3)
    for rank, o in enumerate(out):
        assert o.shape == (2, 3, 4), f"rank {rank}: shape {tuple(o.shape)}, expected (2, 3, 4)"
    assert_close_per_rank(out, torch.full((2, 3, 4), 3.0), "ring_all_reduce of ones on 3 ranks")
