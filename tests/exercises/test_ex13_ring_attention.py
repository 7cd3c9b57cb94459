"""ex13: the online-softmax merge, then one step of ring attention. The student's code runs
in the exercise's sandbox (``ex.f(...)``, ``ex.run``); values come back as data and every
verdict is reached here."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import lecture_lib
from lecture_lib.grading import load_exercise
from lecture_lib.grading.harness import difference, record_dist

ex = load_exercise("ex13")
POINTS = 10


def _same(got, want, what):
    """``got`` equals ``want`` (torch's default tolerance), else what it is and how it differs."""
    try:
        torch.testing.assert_close(got, want)
    except AssertionError as exc:
        raise AssertionError(f"{what} is wrong: {difference(got, want, exc)}") from None


def _qkv(seed, shape=(1, 2, 6, 4), scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) * scale for _ in range(3)]


def test_merge_of_two_blocks_is_one_softmax():
    q, k, v = _qkv(0)
    a = ex.block_attention(q, k[..., :2, :], v[..., :2, :])
    b = ex.block_attention(q, k[..., 2:, :], v[..., 2:, :])
    o, lse = ex.merge(*a, *b)
    _same(o, F.scaled_dot_product_attention(q, k, v),
          "merge's o (against one softmax over the keys of both blocks)")
    _same(lse, torch.logsumexp(q @ k.transpose(-2, -1) / 2.0, -1),
          "merge's lse (against the log-sum-exp of the scores of both blocks)")
    o2, lse2 = ex.merge(*b, *a)
    _same(o2, o, "merge(b, a)'s o (it should equal merge(a, b)'s)")
    _same(lse2, lse, "merge(b, a)'s lse (it should equal merge(a, b)'s)")


@pytest.mark.weight(2.5)
def test_merge_does_not_overflow():
    q, k, v = _qkv(1, scale=40.0)                      # scores in the thousands
    o, lse = ex.merge(*ex.block_attention(q, k[..., :3, :], v[..., :3, :]),
                      *ex.block_attention(q, k[..., 3:, :], v[..., 3:, :]))
    assert torch.isfinite(o).all() and torch.isfinite(lse).all(), (
        f"scores in the thousands: {int((~torch.isfinite(o)).sum())} non-finite values in o, "
        f"{int((~torch.isfinite(lse)).sum())} in lse")
    _same(o, F.scaled_dot_product_attention(q, k, v),
          "merge's o with scores in the thousands (against one softmax over both blocks)")


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
        _same(got, torch.stack([lk, lv]), f"rank {rank}: the block received (it should be "
              f"rank {left}'s K/V: blocks travel to rank + 1)")
        _same(first[0], ex.block_attention(q, k, v)[0], f"rank {rank}: o after one step (it "
              "should be attention over its own block)")
        both = F.scaled_dot_product_attention(q, torch.cat([k, lk], -2), torch.cat([v, lv], -2))
        _same(second[0], both, f"rank {rank}: o after two steps (it should be attention over "
              "its own block and its left neighbour's)")


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


@pytest.mark.weight(6)
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
        _same(out, F.scaled_dot_product_attention(parts[rank][0], k, v), f"rank {rank}: the "
              "ring's output (against one softmax over every rank's keys)")


def _ring_traffic():
    """On a rank: ring_attention's output, every process-group call it made (kind, bytes)
    and how many times it called block_attention."""
    rank = dist.get_rank()
    q, k, v = _qkv(20 + rank)
    real, blocks = ex.block_attention, []

    def probe(*args, **kwargs):
        blocks.append(1)
        return real(*args, **kwargs)
    ex.block_attention = probe
    try:
        with record_dist() as events:
            out = ex.ring_attention(q, k, v)
    finally:
        ex.block_attention = real
    return out, [(e["kind"], e["bytes"]) for e in events], len(blocks)


BLOCK = 2 * 1 * 2 * 6 * 4 * 8           # one rank's K and V (2, 1, 2, 6, 4), float64: bytes


@pytest.mark.weight(3)
@pytest.mark.parametrize("world_size", [2, 3])
def test_the_ring_passes_one_block_per_step(world_size):
    """ring_attention goes round the ring: only send/recv, one K/V block per message,
    p - 1 or p hops (the given loop exchanges in every one of its p steps), and
    block_attention once per block; no rank ever holds every rank's K and V."""
    for rank, (_, events, blocks) in enumerate(ex.run(_ring_traffic, world_size, timeout=60)):
        kinds = [kind for kind, _ in events]
        other = sorted(set(kinds) - {"send", "recv"})
        assert not other, (
            f"rank {rank}: ring_attention ran {' and '.join(other)}: ring attention never "
            "holds every rank's K and V at once (that is what lets the sequence grow with the "
            "ranks); each step passes one block to the next rank with ring_step's send/recv")
        received = [nbytes for kind, nbytes in events if kind == "recv"]
        hops = sum(received) / BLOCK
        assert max(received, default=0) <= BLOCK and hops in (world_size - 1, world_size), (
            f"rank {rank}: ring_attention received {len(received)} messages of {received} "
            f"bytes ({hops:g} blocks of {BLOCK} bytes); the ring passes one block per step, "
            f"{world_size - 1} or {world_size} steps with {world_size} ranks")
        assert blocks == world_size, (
            f"rank {rank}: ring_attention called block_attention {blocks} times; expected "
            f"{world_size}, one per block as it passes (each rank attends to every rank's "
            "block once, one at a time, merging as it goes)")


def test_one_rank_attends_to_its_own_block_without_messages():
    """world_size == 1: no ring, no message; ring_step attends to its block and hands it back."""
    try:
        [(out, events, blocks)] = ex.run(_ring_traffic, 1, timeout=60)
    except lecture_lib.RankError as exc:
        raise AssertionError(
            "with one rank, ring_attention failed: a rank cannot message itself; with "
            "world_size == 1, ring_step sends and receives nothing and returns the block it "
            f"holds\n{exc}") from None
    q, k, v = _qkv(20)
    assert not events, (
        f"with one rank, ring_attention sent or received {[kind for kind, _ in events]}: a "
        "rank cannot message itself; with world_size == 1, ring_step exchanges nothing and "
        "returns the block it holds")
    _same(out, F.scaled_dot_product_attention(q, k, v),
          "one rank: the ring's output (against attention over its own block)")
    assert blocks == 1, f"one rank: block_attention called {blocks} times, expected once"
