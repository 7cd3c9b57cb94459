"""ex02: overlapped, bucketed DDP. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file."""
import pytest
import torch
import torch.distributed as dist

from lecture_lib.grading import load_exercise
from lecture_lib.models import (
    GPT,
    GPTConfig,
    MarkovText,
    TrainResult,
    assert_same_training,
    make_optimizer,
    shard,
    train_reference,
)

ex = load_exercise("ex02")
POINTS = 10
CFG = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=2, n_layers=2)
DATA = MarkovText(CFG.vocab_size, CFG.seq_len, seed=3)
BATCH, STEPS, LR = 8, 3, 0.5      # SGD: equality to one process within rtol 1e-5


def _train_on_rank(bucket_size_mb):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = GPT(CFG, seed=rank)                      # different: construction must broadcast
    calls = []
    real_all_reduce = dist.all_reduce

    def recording_all_reduce(tensor, *args, **kwargs):
        calls.append(kwargs.get("async_op", False))
        return real_all_reduce(tensor, *args, **kwargs)

    ddp = ex.BucketedDDP(model, bucket_size_mb)
    dist.all_reduce = recording_all_reduce      # restored below: the worker serves later calls
    try:
        opt = make_optimizer(model.parameters(), "sgd", LR)
        losses, launched_in_backward = [], []
        for step in range(STEPS):
            x, y = shard(DATA.batch(step, BATCH), rank, world)
            opt.zero_grad(set_to_none=True)
            loss = ddp(x, y)
            calls.clear()
            loss.backward()
            launched_in_backward.append(list(calls))
            ddp.finish_gradient_synchronization()
            opt.step()
            total = loss.detach().clone()
            real_all_reduce(total)
            losses.append(total.item() / world)
    finally:
        dist.all_reduce = real_all_reduce
    return {"result": TrainResult(losses, {k: v.detach().clone()
                                           for k, v in model.named_parameters()}),
            "launched": launched_in_backward, "buckets": len(ddp.buckets)}


def _reference():
    return train_reference(GPT(CFG, seed=0), lambda s: DATA.batch(s, BATCH), STEPS, lr=LR,
                           optimizer="sgd")


@pytest.mark.parametrize("world_size,bucket_size_mb", [(2, 0.02), (4, 0.02), (2, 1000.0)])
def test_trains_equal_to_one_process(world_size, bucket_size_mb):
    expected = _reference()
    for rank, res in enumerate(ex.run(_train_on_rank, world_size, bucket_size_mb,
                                               timeout=120)):
        try:
            assert_same_training(res["result"], expected, rtol=1e-5)
        except AssertionError as exc:
            raise AssertionError(f"rank {rank} of {world_size}: {exc}") from None


def test_buckets_are_launched_async_during_backward():
    model_bytes = sum(p.numel() * 4 for p in GPT(CFG).parameters())
    res = ex.run(_train_on_rank, 2, 0.02, timeout=120)[0]
    least = model_bytes / (0.02 * 2**20) - 1
    assert res["buckets"] >= least and res["buckets"] > 1, (
        f"rank 0: {res['buckets']} buckets for {model_bytes} bytes of gradients in buckets of "
        f"0.02 MB: expected at least {max(least, 2):.0f}")
    for step, calls in enumerate(res["launched"]):
        assert len(calls) == res["buckets"], (
            f"step {step}: {len(calls)} all-reduces launched during backward, expected one per "
            f"bucket ({res['buckets']})")
        assert all(calls), (f"step {step}: expected every all-reduce launched with "
                            f"async_op=True, got {calls}")


def test_one_bucket_when_it_is_large():
    res = ex.run(_train_on_rank, 2, 1000.0, timeout=120)[0]
    launched = [len(c) for c in res["launched"]]
    assert res["buckets"] == 1 and all(n == 1 for n in launched), (
        f"rank 0, buckets of 1000 MB: expected 1 bucket and 1 all-reduce per step, got "
        f"{res['buckets']} buckets and {launched} all-reduces")


def test_bucket_size_must_be_positive():
    model = torch.nn.Linear(2, 2)
    for bad in (0, -1.0):
        with pytest.raises(ValueError):
            ex.BucketedDDP(model, bad)
