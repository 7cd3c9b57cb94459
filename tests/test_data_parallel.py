"""lecture_lib.data_parallel: every variant trains equal to one process (rtol 1e-5)."""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import lecture_lib
from lecture_lib import data_parallel as DP
from lecture_lib.costmodel import (
    best_bucket_bytes,
    ddp_overhead,
    fit_ddp_overhead,
    two_stream_step,
)
from lecture_lib.data_parallel import experiments as dpx
from lecture_lib.models import (
    GPT,
    GPTConfig,
    MarkovText,
    assert_same_training,
    shard,
    train_reference,
)

CFG = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=2, n_layers=2)
DATA = MarkovText(CFG.vocab_size, CFG.seq_len, seed=1)
BATCH, STEPS, RTOL = 8, 3, 1e-5
# The GPT trains with SGD: the key projection's bias has an exactly-zero true gradient
# (softmax ignores a shift shared by every key), so its computed gradient is rounding noise
# that Adam would normalise into lr-sized steps, differing with summation order. The
# tied/frozen model has no such parameter and trains with AdamW.
OPTIMIZER = {"gpt": ("sgd", 0.5), "tied": ("adamw", 1e-2)}
VARIANTS = ("naive", "flat", "individual", "bucketed", "torch")


class TiedFrozen(nn.Module):
    """Tied embedding/output weights and a frozen layer: the awkward cases."""

    def __init__(self, seed=0, vocab=32, d=16):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(vocab, d)
        self.frozen = nn.Linear(d, d)
        self.mlp = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight                       # tied
        self.register_buffer("scale", torch.ones(d))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        self.frozen.requires_grad_(False)

    def forward(self, idx, targets):
        x = self.emb(idx) * self.scale
        x = x + torch.tanh(self.mlp(torch.relu(self.frozen(x))))
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def _train_every_variant(jobs):
    """Each job: (variant, model name, accumulation, bucket MB, sync every micro-batch)."""
    out = {}
    for job in jobs:
        variant, name, accumulation, bucket, every = job
        model = GPT(CFG, seed=0) if name == "gpt" else TiedFrozen(seed=dist.get_rank())
        opt, lr = OPTIMIZER[name]
        out[job] = dpx.train_data_parallel(variant, model, lambda s: DATA.batch(s, BATCH),
                                           STEPS, lr=lr, optimizer=opt, accumulation=accumulation,
                                           bucket_size_mb=bucket, sync_every_micro_batch=every)
    return out


def _reference(name):
    model = GPT(CFG, seed=0) if name == "gpt" else TiedFrozen(seed=0)
    opt, lr = OPTIMIZER[name]
    return train_reference(model, lambda s: DATA.batch(s, BATCH), STEPS, lr=lr, optimizer=opt)


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_variant_trains_equal_to_one_process(world_size):
    jobs = [(v, "gpt", acc, 0.01, False) for v in VARIANTS for acc in (1, 2)]
    jobs += [("bucketed", "gpt", 1, None, False),           # one bucket
             ("individual", "gpt", 2, None, True),          # sync every micro-batch
             ("bucketed", "gpt", 2, 0.001, True)]
    jobs += [(v, "tied", acc, 0.001, False) for v in ("individual", "bucketed") for acc in (1, 2)]
    results = lecture_lib.run(_train_every_variant, world_size, jobs, timeout=240)
    expected = {name: _reference(name) for name in ("gpt", "tied")}
    for job in jobs:
        for rank, per_rank in enumerate(results):
            try:
                assert_same_training(per_rank[job], expected[job[1]], rtol=RTOL)
            except AssertionError as exc:
                raise AssertionError(f"{job} on rank {rank} of {world_size}: {exc}") from None
    frozen = expected["tied"].params["frozen.weight"]
    assert torch.equal(TiedFrozen(seed=0).frozen.weight.detach(), frozen)


def _counted_accumulation_on_rank(micro_batches):
    """DDPBucketed told how many backward passes make a step (no no_sync): the buckets go
    out during the last one only."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = GPT(CFG, seed=0).to(lecture_lib.device())
    ddp = DP.DDPBucketed(model, bucket_size_mb=0.01, accumulation=micro_batches)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    launched = []                                   # buckets in flight after each backward
    for step in range(STEPS):
        x, y = shard(DATA.batch(step, BATCH), rank, world)
        opt.zero_grad(set_to_none=True)
        for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            (model(xm, ym) / micro_batches).backward()
            launched.append(len(ddp._launched))
        ddp.finish_gradient_synchronization()
        opt.step()
    return {"params": {k: v.detach().clone() for k, v in model.named_parameters()},
            "launched": launched, "buckets": len(ddp.buckets)}


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_bucketed_counts_the_backward_passes_of_a_step(micro_batches):
    results = lecture_lib.run(_counted_accumulation_on_rank, 2, micro_batches, timeout=120)
    expected = train_reference(GPT(CFG, seed=0), lambda s: DATA.batch(s, BATCH), STEPS, lr=0.5,
                               optimizer="sgd")
    for r in results:
        for name, value in expected.params.items():
            torch.testing.assert_close(r["params"][name], value, rtol=RTOL, atol=1e-6)
        per_step = [r["launched"][i:i + micro_batches]
                    for i in range(0, len(r["launched"]), micro_batches)]
        assert r["buckets"] > 1
        # nothing goes out before the last backward of a step; every bucket during it
        assert all(s == [0] * (micro_batches - 1) + [r["buckets"]] for s in per_step), per_step


def _replicas_on_rank():
    out = {}
    for variant in ("individual", "bucketed", "naive"):
        model = TiedFrozen(seed=dist.get_rank() + 1)            # different on every rank
        ddp = DP.wrap(variant, model, bucket_size_mb=0.001)
        out[variant] = {k: v.clone() for k, v in model.state_dict().items()}
        assert ddp.module is model
    out["tied"] = ddp.module.head.weight is ddp.module.emb.weight
    bucketed = DP.DDPBucketed(TiedFrozen(), bucket_size_mb=0.001)
    out["buckets"] = [[n for p in b for n, q in bucketed.module.named_parameters() if q is p]
                      for b in bucketed.buckets]
    return out


def test_construction_broadcasts_rank_0_and_buckets_in_reverse_order():
    results = lecture_lib.run(_replicas_on_rank, 2, timeout=60)
    for variant in ("individual", "bucketed", "naive"):
        for k, v in results[1][variant].items():
            torch.testing.assert_close(v, results[0][variant][k], rtol=0, atol=0)
    assert results[0]["tied"]
    flat = [n for b in results[0]["buckets"] for n in b]
    assert flat == ["mlp.bias", "mlp.weight", "emb.weight"]   # reversed; tied once, frozen never
    assert len(results[0]["buckets"]) > 1


def test_make_buckets():
    params = [torch.zeros(256), torch.zeros(64), torch.zeros(1024), torch.zeros(8)]  # floats
    mb = 2 ** 20
    buckets = DP.make_buckets(params, 1300 / mb)
    assert [[p.numel() for p in b] for b in buckets] == [[8], [1024], [64, 256]]
    assert [[p.numel() for p in b] for b in DP.make_buckets(params, None)] == [[8, 1024, 64, 256]]
    assert len(DP.make_buckets(params, 1e-9)) == 4              # each too big: its own bucket


def test_bad_input_before_any_process_starts():
    model = nn.Linear(2, 2)
    for bad in (0, -1, 0.0):
        with pytest.raises(ValueError, match="bucket_size_mb must be > 0"):
            DP.DDPBucketed(model, bad)
    with pytest.raises(TypeError, match="bucket_size_mb"):
        DP.DDPBucketed(model, "25")
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="accumulation"):
            DP.DDPBucketed(model, 25, accumulation=bad)
    with pytest.raises(ValueError, match="variant"):
        dpx.check_training_args("zero", 1, 1)
    with pytest.raises(ValueError, match="accumulation"):
        dpx.check_training_args("flat", 1, 0)
    with pytest.raises(RuntimeError, match="no process group"):
        DP.DDPIndividualParameters(model)


def _bad_inside_ranks():
    errors = {}
    group = dist.new_group([1])
    cases = {"device": lambda: DP.DDPIndividualParameters(nn.Linear(2, 2, device="meta")),
             "group": lambda: DP.DDPBucketed(nn.Linear(2, 2), 1, group=group),
             "module": lambda: DP.DDPFlat("not a module")}
    for name, call in cases.items():
        try:
            call()
        except (ValueError, TypeError) as exc:
            errors[name] = str(exc)
    return errors


def test_bad_input_inside_ranks_is_a_clear_error():
    errors = lecture_lib.run(_bad_inside_ranks, 2, timeout=60)[0]
    assert "device" in errors["device"]
    assert "not a member of the group" in errors["group"]
    assert "nn.Module" in errors["module"]


def _fails_on_rank_1():
    model = GPT(CFG, seed=0)
    def batches(step):
        if dist.get_rank() == 1 and step == 1:
            raise RuntimeError("data loader broke")
        return DATA.batch(step, BATCH)
    return dpx.train_data_parallel("bucketed", model, batches, 3, bucket_size_mb=0.01)


def test_a_failing_rank_ends_the_call_with_its_error_and_the_next_call_works():
    with pytest.raises(lecture_lib.RankError, match="rank 1.*data loader broke"):
        lecture_lib.run(_fails_on_rank_1, 2, timeout=60)
    assert lecture_lib.run(lambda: dist.get_world_size(), 2, timeout=60) == [2, 2]


def test_overhead_model_and_its_fit():
    s, w, o = 4e6, 2e8, 1e-3
    assert ddp_overhead(s, w, o, 4) == pytest.approx(4e-3 + s / (w * 4))
    best = best_bucket_bytes(s, w, o)
    n_best = s / best
    assert ddp_overhead(s, w, o, n_best) < min(ddp_overhead(s, w, o, n_best * f)
                                               for f in (0.7, 1.4))
    n = [1, 2, 4, 8, 16, 32]
    got_w, got_o = fit_ddp_overhead(s, n, [ddp_overhead(s, w, o, k) for k in n])
    assert got_w == pytest.approx(w, rel=1e-6) and got_o == pytest.approx(o, rel=1e-6)
    # no per-call cost in the data: fitted o is zero, not negative
    assert 0 <= fit_ddp_overhead(s, n, [s / (w * k) for k in n])[1] < 1e-12
    with pytest.raises(ValueError):
        ddp_overhead(s, w, o, 0)
    with pytest.raises(ValueError):
        fit_ddp_overhead(s, [1], [1.0])


def _compare_on_rank():
    configs = {"flat": dict(variant="flat"),
               "bucketed": dict(variant="bucketed", bucket_size_mb=0.01),
               "acc2": dict(variant="individual", accumulation=2, sync_every_micro_batch=True)}
    return dpx.compare_variants(configs, lambda: GPT(CFG, seed=0), lambda s: DATA.batch(s, BATCH),
                                steps=2, warmup=1)


def test_compare_variants_measures_every_config():
    results = lecture_lib.run(_compare_on_rank, 2, timeout=120)
    for r in results[0].values():
        assert len(r["step_times"]) == 2 and min(r["step_times"]) > 0
        assert set(r["totals"]) == {"compute", "comm", "optimizer"}
        assert [k for k, *_ in r["spans"]][-2:] == ["comm", "optimizer"]
        assert r["model_bytes"] == sum(p.numel() * 4 for p in GPT(CFG).parameters())
    assert results[0]["bucketed"]["buckets"] > 1 and results[0]["flat"]["buckets"] == 0
    assert [k for k, *_ in results[0]["acc2"]["spans"]] == ["compute", "comm", "compute", "comm",
                                                           "optimizer"]
    assert results[0]["flat"]["step_times"] == results[1]["flat"]["step_times"]  # slowest rank
    with pytest.raises(ValueError, match="unknown keys"):
        dpx.compare_variants({"x": dict(variant="flat", bucket=1)}, None, None, 1)


def test_two_stream_step_queues_the_all_reduces():
    # one bucket, ready when backward ends: nothing hides it
    assert two_stream_step([10.0], [4.0], backward_end=10.0, optimizer=1.0) == 15.0
    # fast links: each all-reduce ends before the next bucket is ready; only the last shows
    assert two_stream_step([4.0, 7.0, 10.0], [1.0, 1.0, 1.0], 10.0) == 11.0
    # slow links: the stream is busy from the first bucket on; backward is hidden
    assert two_stream_step([4.0, 7.0, 10.0], [5.0, 5.0, 5.0], 10.0) == 4.0 + 15.0
    # the closed form F + max(B, C - c_last) + c_last (here 2 + max(8, 10) + 5 = 17) misses
    # that the stream cannot start before the first bucket is ready (at 4)
    assert two_stream_step([4.0, 7.0, 10.0], [5.0, 5.0, 5.0], 10.0) > 2 + max(8, 10) + 5
    with pytest.raises(ValueError, match="one ready time"):
        two_stream_step([1.0], [1.0, 2.0], 3.0)
    with pytest.raises(ValueError, match=">= 0"):
        two_stream_step([1.0], [-1.0], 3.0)
