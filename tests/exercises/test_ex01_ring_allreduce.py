"""ex01: ring all-reduce from send/recv. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file.

Each phase is checked on its own first, on inputs of its own: ``reduce_scatter_`` on every
rank's chunks, ``all_gather_`` on chunks where only ``chunks[rank]`` holds data (what a
correct reduce-scatter leaves), then ``ring_all_reduce`` end to end; so an off-by-one in one
phase fails that phase's test by name. The sandbox refuses every collective (the process
group's methods, its backend's, the c10d operators) and the library's ring collectives."""
import functools

import pytest
import torch
import torch.distributed as dist

from lecture_lib import RankError
from lecture_lib.grading import assert_close_per_rank, load_exercise
from lecture_lib.grading.harness import record_dist

ex = load_exercise("ex01")
POINTS = 10
# A correct ring finishes in well under a second; a deadlock ends here with every rank's stack.
TIMEOUT = 15
NUMELS = (12, 7, 2)                  # divisible, not divisible, fewer elements than ranks
WORLD_SIZES = [1, 2, 3, 4]


def _input(numel, rank):
    return torch.arange(numel, dtype=torch.float32) * 7 % 5 + 10 * rank


def _owned(numel, p, rank):
    """Chunks of a flat buffer where only chunk ``rank`` holds data (rank-specific), the
    others NaN: what all_gather_ starts from after a reduce-scatter."""
    flat = torch.full((numel,), float("nan"))
    chunks = list(torch.tensor_split(flat, p))
    chunks[rank].copy_(torch.arange(chunks[rank].numel(), dtype=torch.float32) + 100 * rank)
    return flat, chunks


def _phases(numels):
    """On a rank: each phase alone, then the whole; verdicts are reached in the tests."""
    rank, p = dist.get_rank(), dist.get_world_size()
    out = []
    for numel in numels:
        flat = _input(numel, rank)
        chunks = list(torch.tensor_split(flat, p))
        ex.reduce_scatter_(chunks)
        mine = chunks[rank].clone()
        gathered, owned = _owned(numel, p, rank)
        ex.all_gather_(owned)
        x = _input(numel, rank)
        result = ex.ring_all_reduce(x)
        out.append({"mine": mine, "gathered": gathered, "out": result, "input": x})
    return out


@functools.lru_cache(maxsize=None)
def _results(world_size):
    """One run per world size serves its three tests; a failure is raised by each of them."""
    try:
        return ex.run(_phases, world_size, NUMELS, timeout=TIMEOUT)
    except Exception as err:                     # noqa: BLE001  (raised again by each test)
        if not isinstance(err, RankError) or "Pair is not connected" not in str(err):
            return err
        return AssertionError(
            f"with {world_size} rank(s), a rank sent a message to itself or received one from "
            "itself (gloo: 'Pair is not connected'). How many steps does each ring take when "
            "there is one rank?\n\n" + str(err))


def _per_numel(world_size):
    res = _results(world_size)
    if isinstance(res, BaseException):
        raise res
    for i, numel in enumerate(NUMELS):
        yield numel, [r[i] for r in res], f"{world_size} ranks, {numel} elements"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_reduce_scatter_leaves_each_rank_its_summed_chunk(world_size):
    """reduce_scatter_ alone: chunks[rank] holds that chunk's sum over the ranks."""
    for numel, results, where in _per_numel(world_size):
        total = sum(_input(numel, r) for r in range(world_size))
        assert_close_per_rank([r["mine"] for r in results],
                              list(torch.tensor_split(total, world_size)),
                              f"reduce_scatter_ alone: chunks[rank] afterwards ({where})")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_gather_fills_every_chunk_from_its_owner(world_size):
    """all_gather_ alone: every chunk ends as its owner's."""
    for numel, results, where in _per_numel(world_size):
        want = torch.cat([_owned(numel, world_size, r)[1][r] for r in range(world_size)])
        assert_close_per_rank([r["gathered"] for r in results], want,
                              f"all_gather_ alone, starting from chunks where only "
                              f"chunks[rank] holds data: the whole buffer afterwards ({where})")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ring_all_reduce_gives_every_rank_the_sum(world_size):
    """ring_all_reduce: the sum on every rank, the input unchanged."""
    for numel, results, where in _per_numel(world_size):
        total = sum(_input(numel, r) for r in range(world_size))
        assert_close_per_rank([r["out"] for r in results], total, f"ring_all_reduce ({where})")
        for rank, res in enumerate(results):
            assert torch.equal(res["input"], _input(numel, rank)), \
                f"ring_all_reduce changed its input (rank {rank}, {where})"


def test_shape_is_kept():
    """ring_all_reduce returns the input's shape."""
    out = ex.run(lambda: ex.ring_all_reduce(torch.ones(2, 3, 4)), 3, timeout=TIMEOUT)
    for rank, o in enumerate(out):
        assert o.shape == (2, 3, 4), f"rank {rank}: shape {tuple(o.shape)}, expected (2, 3, 4)"
    assert_close_per_rank(out, torch.full((2, 3, 4), 3.0), "ring_all_reduce of ones on 3 ranks")


RING_NUMEL = 12                      # 3 or 4 equal chunks of 16 or 12 bytes


def _messages_on_rank():
    """On a rank: the messages of each phase alone and of ring_all_reduce, as (kind, peer,
    bytes)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, call in (
            ("reduce_scatter_", lambda: ex.reduce_scatter_(
                list(torch.tensor_split(_input(RING_NUMEL, rank), p)))),
            ("all_gather_", lambda: ex.all_gather_(_owned(RING_NUMEL, p, rank)[1])),
            ("ring_all_reduce", lambda: ex.ring_all_reduce(_input(RING_NUMEL, rank)))):
        with record_dist() as events:
            call()
        out[name] = [(e["kind"], e.get("peer"), e["bytes"]) for e in events]
    return out


@pytest.mark.weight(8)
@pytest.mark.parametrize("world_size", [3, 4])
def test_messages_go_round_the_ring(world_size):
    """Every message goes to the right neighbour, one chunk per step: world_size - 1 per phase,
    2 (world_size - 1) chunks for ring_all_reduce (with 2 ranks every pattern is a ring)."""
    chunk = RING_NUMEL // world_size * 4
    for rank, phases in enumerate(ex.run(_messages_on_rank, world_size, timeout=TIMEOUT)):
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        for name, events in phases.items():
            steps = (2 if name == "ring_all_reduce" else 1) * (world_size - 1)
            sent = [(peer, b) for kind, peer, b in events if kind == "send"]
            received = [(peer, b) for kind, peer, b in events if kind == "recv"]
            assert sent == [(right, chunk)] * steps and received == [(left, chunk)] * steps, (
                f"{name} on rank {rank} of {world_size} ({RING_NUMEL} elements): sent "
                f"{_listed(sent)} and received {_listed(received)}; round the ring it sends "
                f"only to its right neighbour (rank {right}) and receives only from its left "
                f"(rank {left}): {steps} messages each way, one chunk ({chunk} bytes) each, "
                f"{steps * chunk} bytes in all")


def _listed(messages):
    if not messages:
        return "no message"
    peers = sorted({peer for peer, _ in messages})
    return (f"{len(messages)} message(s), {sum(b for _, b in messages)} bytes, with rank(s) "
            f"{peers}")
