"""ex02: overlapped, bucketed DDP. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file. Most of the points are for the
point of the exercise: one async all-reduce per bucket, each launched during backward as soon
as its bucket is full (counted, with how many gradients were in at each launch)."""
import functools

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
    """On a rank: train, and record every all-reduce (async or not, its elements, how many
    gradients were in when it was launched), during backward and after it, the order in
    which the gradients arrived, and the buckets (as parameter names)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = GPT(CFG, seed=rank)                      # different: construction must broadcast
    params = list(model.parameters())
    calls = []
    real_all_reduce = dist.all_reduce

    def recording_all_reduce(tensor, *args, **kwargs):
        ready = sum(p.grad is not None for p in params)
        calls.append((bool(kwargs.get("async_op", False)), tensor.numel(), ready))
        return real_all_reduce(tensor, *args, **kwargs)

    ddp = ex.BucketedDDP(model, bucket_size_mb)
    names = {p: n for n, p in model.named_parameters()}
    arrived = []
    for n, p in model.named_parameters():       # after the submission's hooks: they run first
        p.register_post_accumulate_grad_hook(lambda p, n=n: arrived.append(n))
    dist.all_reduce = recording_all_reduce      # restored below: the worker serves later calls
    try:
        opt = make_optimizer(model.parameters(), "sgd", LR)
        losses, launched_in_backward, after_backward, order = [], [], [], []
        for step in range(STEPS):
            x, y = shard(DATA.batch(step, BATCH), rank, world)
            opt.zero_grad(set_to_none=True)
            loss = ddp(x, y)
            calls.clear()
            arrived.clear()
            loss.backward()
            launched_in_backward.append(list(calls))
            order.append(list(arrived))
            calls.clear()
            ddp.finish_gradient_synchronization()
            after_backward.append(list(calls))
            opt.step()
            total = loss.detach().clone()
            real_all_reduce(total)
            losses.append(total.item() / world)
    finally:
        dist.all_reduce = real_all_reduce
    try:
        buckets = [[names.get(p, "?") for p in bucket] for bucket in ddp.buckets]
    except TypeError:
        buckets = None
    return {"result": TrainResult(losses, {k: v.detach().clone()
                                           for k, v in model.named_parameters()}),
            "launched": [[a for a, _, _ in c] for c in launched_in_backward],
            "in_backward": launched_in_backward, "after_backward": after_backward,
            "order": order, "bucket_names": buckets, "buckets": len(ddp.buckets),
            "params": len(params)}


def _expected_buckets(bucket_size_mb):
    """The statement's buckets, as parameter names: the parameters in reverse, a new bucket
    when the next would push the bucket past the limit."""
    limit, buckets, used = bucket_size_mb * 2**20, [[]], 0
    for name, p in reversed(list(GPT(CFG).named_parameters())):
        size = p.numel() * p.element_size()
        if buckets[-1] and used + size > limit:
            buckets.append([])
            used = 0
        buckets[-1].append(name)
        used += size
    return buckets


def _said(calls, params):
    """The all-reduces of a step, in words."""
    if not calls:
        return "none"
    blocking = sum(not a for a, _, _ in calls)
    how = ("all blocking (async_op=False)" if blocking == len(calls) else
           "all with async_op=True" if not blocking else f"{blocking} of them blocking")
    each = " (one per parameter)" if len(calls) == params else ""
    return f"{len(calls)}{each}, {how}"


def _check_launches(res, step, what):
    """One async all-reduce per bucket during backward, else a message saying what ran
    instead and when."""
    during, after = res["in_backward"][step], res["after_backward"][step]
    buckets, params = res["buckets"], res["params"]
    if len(during) == buckets and all(a for a, _, _ in during):
        return
    raise AssertionError(
        f"rank 0, {what}, step {step}: all-reduces launched during backward: "
        f"{_said(during, params)}; after backward (in finish_gradient_synchronization): "
        f"{_said(after, params)}. Expected one per bucket ({buckets}), each launched with "
        "async_op=True from the hook as soon as its bucket's last gradient arrives, during "
        "backward" + (": nothing was overlapped with backward and nothing bucketed"
                      if not during and len(after) == params else
                      ": nothing was overlapped with backward" if not during else ""))


@functools.lru_cache(maxsize=None)
def _run(world_size, bucket_size_mb):
    """The ranks' results of one training run (shared by the tests that read it)."""
    return ex.run(_train_on_rank, world_size, bucket_size_mb, timeout=120)


def _reference():
    return train_reference(GPT(CFG, seed=0), lambda s: DATA.batch(s, BATCH), STEPS, lr=LR,
                           optimizer="sgd")


@pytest.mark.parametrize("world_size,bucket_size_mb", [(2, 0.02), (4, 0.02), (2, 1000.0)])
def test_trains_equal_to_one_process(world_size, bucket_size_mb):
    """Training on the ranks equals training on one process (SGD, rtol 1e-5)."""
    expected = _reference()
    for rank, res in enumerate(_run(world_size, bucket_size_mb)):
        try:
            assert_same_training(res["result"], expected, rtol=1e-5)
        except AssertionError as exc:
            raise AssertionError(f"rank {rank} of {world_size}: {exc}") from None


def test_buckets_hold_the_parameters_in_reverse_up_to_the_size():
    """self.buckets: the parameters in reverse order, a new bucket at the size limit."""
    res = _run(2, 0.02)[0]
    want = _expected_buckets(0.02)
    got = res["bucket_names"]
    assert got is not None, "rank 0: self.buckets is not a list of lists of parameters"
    differ = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    first = differ[0] if differ else min(len(got), len(want))
    assert got == want, (
        f"rank 0, buckets of 0.02 MB: got {len(got)} buckets, expected {len(want)}; the first "
        f"that differs, bucket {first}, holds {got[first] if first < len(got) else 'nothing'}"
        f", expected {want[first] if first < len(want) else 'no bucket'} (walk the parameters "
        "in reverse, start a new bucket when the next one would push the bucket past the "
        "size)")


@pytest.mark.weight(7)
def test_buckets_are_launched_async_during_backward_as_soon_as_full():
    """The point of the exercise: one async all-reduce per bucket, each launched during
    backward as soon as its bucket (and those before it) are full, so it overlaps the rest."""
    model_bytes = sum(p.numel() * 4 for p in GPT(CFG).parameters())
    res = _run(2, 0.02)[0]
    least = model_bytes / (0.02 * 2**20) - 1
    assert res["buckets"] >= least and res["buckets"] > 1, (
        f"rank 0: {res['buckets']} buckets for {model_bytes} bytes of gradients in buckets of "
        f"0.02 MB: expected at least {max(least, 2):.0f}")
    for step in range(STEPS):
        _check_launches(res, step, "buckets of 0.02 MB")
        arrival = {name: i + 1 for i, name in enumerate(res["order"][step])}
        soonest, full = [], 0
        for bucket in res["bucket_names"] or []:
            full = max([full] + [arrival.get(name, 0) for name in bucket])
            soonest.append(full)
        launched = [ready for _, _, ready in res["in_backward"][step]]
        assert min(launched) < res["params"], (
            f"rank 0, step {step}: every all-reduce was launched once all {res['params']} "
            "gradients were in: nothing overlaps backward. The first buckets must fill, and "
            "go, while backward is still running (fill them with the parameters in reverse: "
            "backward produces the last layers' gradients first)")
        assert launched == soonest, (
            f"rank 0, step {step}: the buckets' all-reduces were launched when {launched} of "
            f"{res['params']} gradients were in; each could go (in bucket order) as soon as "
            f"its bucket was full: when {soonest} were in. Launch each one from the hook of "
            "its bucket's last gradient, so that it overlaps the rest of backward")


def test_one_bucket_when_it_is_large():
    """With buckets of 1000 MB: one bucket, one async all-reduce during each backward."""
    res = _run(2, 1000.0)[0]
    assert res["buckets"] == 1, (f"rank 0, buckets of 1000 MB: expected 1 bucket, got "
                                 f"{res['buckets']}")
    for step in range(STEPS):
        _check_launches(res, step, "buckets of 1000 MB")


@pytest.mark.weight(0.5)
def test_bucket_size_must_be_positive():
    """A bucket size of 0 or below is a ValueError."""
    model = torch.nn.Linear(2, 2)
    for bad in (0, -1.0):
        with pytest.raises(ValueError):
            ex.BucketedDDP(model, bad)
