"""ex00: ring_sum with send/recv only. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file. The ranks run in the
exercise's sandbox (``ex.run``) and return data; every verdict is reached here. The sandbox
refuses every collective to the submission, at every level (``dist.*``, the process group's
and its backend's methods, the c10d operators, the store), and the library's ring
collectives (lecture_lib.grading.harness.ANSWERS)."""
import pytest
import torch
import torch.distributed as dist

from lecture_lib import RankError
from lecture_lib.grading import assert_close_per_rank, load_exercise
from lecture_lib.grading.harness import record_dist

ex = load_exercise("ex00")
POINTS = 10
# A correct ring finishes in well under a second; a deadlock ends here with every rank's stack.
TIMEOUT = 15


def _input(shape, rank):
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) + 100 * rank


def _ring_sum_on_rank(shape):
    x = _input(shape, dist.get_rank())
    out = ex.ring_sum(x)
    return out, x                       # the input as ring_sum left it


def _run(world_size, shape):
    """The ranks' results; gloo's obscure error for a message to oneself, said plainly."""
    try:
        return ex.run(_ring_sum_on_rank, world_size, shape, timeout=TIMEOUT)
    except RankError as err:
        if "Pair is not connected" not in str(err):
            raise
        raise AssertionError(
            f"with {world_size} rank(s), a rank sent a message to itself or received one from "
            "itself (gloo: 'Pair is not connected'). With one rank its right and left neighbours "
            "are itself: how many ring steps does a sum over one rank need?\n\n"
            + str(err)) from None


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_rank_gets_the_sum(world_size):
    """Every rank returns the element-wise sum over the ranks."""
    results = _run(world_size, (2, 3))
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    expected = sum(base + 100 * r for r in range(world_size))
    assert_close_per_rank([out for out, _ in results], expected, "ring_sum")


def test_input_is_not_modified():
    """ring_sum leaves its input tensor as it was."""
    results = _run(3, (5,))
    for rank, (_, x) in enumerate(results):
        assert torch.equal(x, _input((5,), rank)), f"rank {rank}: ring_sum changed its input tensor"


def _messages_on_rank(shape):
    """On a rank: ring_sum's messages, as (kind, peer, bytes)."""
    with record_dist() as events:
        ex.ring_sum(_input(shape, dist.get_rank()))
    return [(e["kind"], e.get("peer"), e["bytes"]) for e in events]


@pytest.mark.weight(3)
@pytest.mark.parametrize("world_size", [3, 4])
def test_messages_go_round_the_ring(world_size):
    """Each rank sends world_size - 1 tensor-sized messages to its right neighbour only and
    receives them from its left only (with 2 ranks every pattern is a ring: 3 and 4 here)."""
    nbytes = 6 * 4
    for rank, events in enumerate(ex.run(_messages_on_rank, world_size, (2, 3),
                                         timeout=TIMEOUT)):
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        sent = [(peer, b) for kind, peer, b in events if kind == "send"]
        received = [(peer, b) for kind, peer, b in events if kind == "recv"]
        want = world_size - 1
        assert sent == [(right, nbytes)] * want and received == [(left, nbytes)] * want, (
            f"rank {rank} of {world_size}: sent {_listed(sent)} and received "
            f"{_listed(received)}; a ring sends only to its right neighbour (rank {right}) and "
            f"receives only from its left (rank {left}): {want} messages each way, each the "
            f"whole tensor ({nbytes} bytes)")


def _listed(messages):
    if not messages:
        return "no message"
    peers = sorted({peer for peer, _ in messages})
    return (f"{len(messages)} message(s) ({sum(b for _, b in messages)} bytes) with rank(s) "
            f"{peers}")
