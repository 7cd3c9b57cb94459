"""ex13: the online-softmax merge, then one step of ring attention. The student's code runs
in the exercise's sandbox (``ex.f(...)``, ``ex.run``); values come back as data and every
verdict is reached here."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lecture_lib.grading import load_exercise
from lecture_lib.grading.harness import record_dist

ex = load_exercise("ex13")
POINTS = 10


def _qkv(seed, shape=(1, 2, 6, 4), scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) * scale for _ in range(3)]


def test_merge_of_two_blocks_is_one_softmax():
    q, k, v = _qkv(0)
    a = ex.block_attention(q, k[..., :2, :], v[..., :2, :])
    b = ex.block_attention(q, k[..., 2:, :], v[..., 2:, :])
    o, lse = ex.merge(*a, *b)
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v),
                               msg=lambda m: f"merged o against one softmax over all keys: {m}")
    torch.testing.assert_close(lse, torch.logsumexp(q @ k.transpose(-2, -1) / 2.0, -1),
                               msg=lambda m: f"merged lse against logsumexp of all scores: {m}")
    o2, lse2 = ex.merge(*b, *a)
    torch.testing.assert_close((o2, lse2), (o, lse),
                               msg=lambda m: f"merge(b, a) differs from merge(a, b): {m}")


def test_merge_does_not_overflow():
    q, k, v = _qkv(1, scale=40.0)                      # scores in the thousands
    o, lse = ex.merge(*ex.block_attention(q, k[..., :3, :], v[..., :3, :]),
                      *ex.block_attention(q, k[..., 3:, :], v[..., 3:, :]))
    assert torch.isfinite(o).all() and torch.isfinite(lse).all(), (
        f"scores in the thousands: {int((~torch.isfinite(o)).sum())} non-finite values in o, "
        f"{int((~torch.isfinite(lse)).sum())} in lse")
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v))


def _one_step():
    rank = dist.get_rank()
    q, k, v = _qkv(10 + rank)
    kv = torch.stack([k, v])
    first, got = ex.ring_step(q, kv, None)
    second, _ = ex.ring_step(q, got, first)
    return first, got, second


@pytest.mark.parametrize("world_size", [2, 4])
def test_one_step_passes_kv_to_the_right_and_merges(world_size):
    results = ex.run(_one_step, world_size, timeout=60)
    for rank, (first, got, second) in enumerate(results):
        q, k, v = _qkv(10 + rank)
        left = (rank - 1) % world_size
        _, lk, lv = _qkv(10 + left)
        torch.testing.assert_close(
            got, torch.stack([lk, lv]), msg=lambda m, rank=rank, left=left:
            f"rank {rank}: the block received should be rank {left}'s K/V: {m}")
        torch.testing.assert_close(
            first[0], ex.block_attention(q, k, v)[0], msg=lambda m, rank=rank:
            f"rank {rank}: after one step, o should be attention over its own block: {m}")
        both = F.scaled_dot_product_attention(q, torch.cat([k, lk], -2), torch.cat([v, lv], -2))
        torch.testing.assert_close(
            second[0], both, msg=lambda m, rank=rank:
            f"rank {rank}: after two steps, o should cover its own and its left block: {m}")


def _step_order():
    """On a rank: what one ring_step did, in order: its messages posted ("send", "recv"),
    the block's compute ("compute": block_attention called) and its waits ("wait")."""
    rank = dist.get_rank()
    q, k, v = _qkv(10 + rank)
    real = ex.block_attention
    with record_dist(waits=True) as events:
        def probe(*args, **kwargs):
            events.append({"kind": "compute"})
            return real(*args, **kwargs)
        ex.block_attention = probe
        try:
            ex.ring_step(q, torch.stack([k, v]), None)
        finally:
            ex.block_attention = real
    return [e["kind"] for e in events]


def test_the_exchange_overlaps_the_block_compute():
    for rank, kinds in enumerate(ex.run(_step_order, 2, timeout=60)):
        seen = " -> ".join(kinds) or "nothing"
        assert "compute" in kinds, (
            f"rank {rank}: ring_step never called block_attention (what it did: {seen}); "
            "attend to the held block with block_attention, as the statement says")
        before = kinds[:kinds.index("compute")]
        assert "send" in before and "recv" in before, (
            f"rank {rank}: the exchange was not posted before the block's compute ({seen}): "
            "post the isend and irecv first, compute while they fly, then wait; exchanging "
            "after the compute overlaps nothing")
        assert "wait" not in before, (
            f"rank {rank}: ring_step waited for the exchange before computing ({seen}): a "
            "blocking send/recv or a wait() before block_attention serialises the two; wait "
            "after the compute")


def _full_ring():
    rank = dist.get_rank()
    q, k, v = _qkv(20 + rank)
    return ex.ring_attention(q, k, v)


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_whole_ring_equals_one_process(world_size):
    results = ex.run(_full_ring, world_size, timeout=60)
    parts = [_qkv(20 + r) for r in range(world_size)]
    k = torch.cat([p[1] for p in parts], -2)
    v = torch.cat([p[2] for p in parts], -2)
    for rank, out in enumerate(results):
        torch.testing.assert_close(
            out, F.scaled_dot_product_attention(parts[rank][0], k, v), msg=lambda m, rank=rank:
            f"rank {rank}: ring output against one softmax over every rank's keys: {m}")
