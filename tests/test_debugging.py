"""lecture_lib.debugging: comm check, gradient consistency, hangs, convergence experiments."""
import math
import os

import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import debugging
from lecture_lib.comm import all_reduce_flat
from lecture_lib.data_parallel import DDPFlat, DDPNaive
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

CFG = GPTConfig(d_model=32, n_layers=2, seq_len=16, n_heads=2)


def test_comm_sanity_check_on_two_ranks():
    checks = debugging.comm_sanity_check(2, numel=1000, timeout=60)
    assert [c.rank for c in checks] == [0, 1]
    assert all(c.ok and c.expected == 3 and c.seconds > 0 and c.bus_gbps > 0 for c in checks)


def test_comm_sanity_check_refuses_bad_input_before_starting():
    with pytest.raises(ValueError, match="numel"):
        debugging.comm_sanity_check(2, numel=0)
    with pytest.raises(ValueError, match="max_seconds"):
        debugging.comm_sanity_check(2, max_seconds=0)


def _planted(case):
    """One data-parallel step on this rank with a planted fault; the check's verdict."""
    rank, size = dist.get_rank(), dist.get_world_size()
    model = GPT(CFG)
    x, y = shard(MarkovText(64, 16).batch(0, 8), rank, size)
    model(x, y).backward()
    debugging.sync_gradients(model, op="sum" if case in ("sum", "flat sum") else "mean",
                             skip=("blocks.1.mlp.fc1.weight",) if case == "skip" else (),
                             flat=case == "flat sum")
    if case == "missing grad" and rank == 1:    # (before the sync it would hang the sync)
        model.head.weight.grad = None
    if case == "value" and rank == 1:
        with torch.no_grad():
            model.blocks[0].attn.q.bias[3] += 0.5
    return debugging.check_gradient_consistency(model), model.ln_f.weight.grad.clone()


def _all_cases():
    return {case: _planted(case)
            for case in ("ok", "sum", "flat sum", "skip", "value", "missing grad")}


def test_gradient_consistency_names_the_first_differing_parameter():
    ranks = lecture_lib.run(_all_cases, 2, timeout=60)
    for found in ranks:
        assert found["ok"][0] is None
        # summing instead of averaging: every replica agrees, so the check cannot see it ...
        assert found["sum"][0] is None
        # ... but the gradients are world_size times the average
        torch.testing.assert_close(found["sum"][1], 2 * found["ok"][1])
        assert found["flat sum"][0] is None      # the same bug in the flat sync
        torch.testing.assert_close(found["flat sum"][1], 2 * found["ok"][1])
        skip = found["skip"][0]
        assert (skip.name, skip.kind, skip.rank) == ("blocks.1.mlp.fc1.weight", "grad", 1)
        assert 0 < skip.max_abs_diff < math.inf
        value = found["value"][0]
        assert (value.name, value.kind, value.rank) == ("blocks.0.attn.q.bias", "value", 1)
        assert value.max_abs_diff == pytest.approx(0.5)
        missing = found["missing grad"][0]
        assert (missing.name, missing.kind, missing.rank) == ("head.weight", "missing grad", 1)
        assert "rank 1" in str(skip)


def test_sync_gradients_trains_like_one_process():
    """Averaged sync (per-parameter and flat) equals one-process training, rtol 1e-5.

    SGD, not AdamW: Adam divides by the root of the squared gradient, so on a
    parameter whose true gradient is ~0 (the key bias: softmax ignores it) it turns
    rounding noise into full-size steps, and no tolerance survives that."""
    data = MarkovText(64, 16)

    def dp(flat):
        rank, size = dist.get_rank(), dist.get_world_size()
        model = GPT(CFG)
        opt = make_optimizer(model.parameters(), "sgd", 0.1)
        losses = []
        for step in range(3):
            x, y = shard(data.batch(step, 8), rank, size)
            opt.zero_grad(set_to_none=True)
            loss = model(x, y)
            loss.backward()
            debugging.sync_gradients(model, flat=flat)
            opt.step()
            t = loss.detach().clone()
            dist.all_reduce(t)
            losses.append(t.item() / size)
        return TrainResult(losses, {k: v.detach().clone() for k, v in model.named_parameters()})

    ref = train_reference(GPT(CFG), lambda s: data.batch(s, 8), 3, lr=0.1, optimizer="sgd")
    for flat in (False, True):
        got = lecture_lib.run(dp, 2, flat, timeout=120)[0]
        assert_same_training(got, ref, rtol=1e-5, atol=1e-6)


def test_the_bugs_are_planted_into_the_course_ddp():
    assert issubclass(debugging.PlantedDDPFlat, DDPFlat)
    assert issubclass(debugging.PlantedDDPNaive, DDPNaive)
    with pytest.raises(ValueError, match="op"):                # checked before any DDP is built
        debugging.planted_ddp(GPT(CFG), op="avg")


def test_sync_gradients_refuses_bad_arguments():
    model = GPT(CFG)
    with pytest.raises(ValueError, match="op"):
        debugging.sync_gradients(model, op="max")
    with pytest.raises(ValueError, match="no parameter"):
        debugging.sync_gradients(model, skip=("nonexistent.weight",))


def test_clipping_tames_a_learning_rate_that_diverges_and_runs_come_back_in_order():
    runs = debugging.sweep([dict(steps=22, lr=1.0), dict(steps=22, lr=1.0, clip=1.0),
                            dict(steps=3, lr=0.1)], world_size=2)
    assert not math.isfinite(runs[0]["losses"][-1])           # diverged
    assert math.isfinite(runs[1]["losses"][-1]) and runs[1]["losses"][-1] < runs[1]["losses"][0]
    assert len(runs[2]["losses"]) == 3


def test_determinism_same_seed_same_losses_and_what_breaks_it():
    a, b = debugging.train_gpt(steps=4), debugging.train_gpt(steps=4)
    assert a["losses"] == b["losses"]                          # bit for bit
    split = debugging.train_gpt(steps=4, microbatches=4)      # another order of additions
    assert split["losses"] == pytest.approx(a["losses"], rel=1e-5)
    other = debugging.train_gpt(steps=4, data_seed=1)
    assert other["losses"][1:] != pytest.approx(a["losses"][1:], rel=1e-3)


def test_train_gpt_refuses_bad_input():
    with pytest.raises(ValueError, match="microbatches"):
        debugging.train_gpt(batch_size=6, microbatches=4)
    with pytest.raises(ValueError, match="lr"):
        debugging.train_gpt(lr=0)
    with pytest.raises(ValueError, match="configs"):
        debugging.sweep([])


# last: a timeout ends the warm pool, the next call pays a cold start
def test_a_skipped_collective_ends_in_a_timeout_with_each_ranks_place():
    with pytest.raises(lecture_lib.RankTimeout) as info:
        lecture_lib.run(debugging.skipped_collective, 2, 1, timeout=3)
    report = debugging.hang_report(info.value)
    assert report[1].startswith("finished")
    assert report[0].startswith("stuck at") and "all_reduce" in report[0]
    with pytest.raises(TypeError):
        debugging.hang_report(RuntimeError("not a timeout"))


def _buggy_step(model, optimizer, x, y):
    """Summed gradients, biases left out of the sync, the local loss returned."""
    optimizer.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    for name, p in model.named_parameters():
        if p.grad is not None and not name.endswith("bias"):
            dist.all_reduce(p.grad)
    optimizer.step()
    return loss.item()


def _flat_step(model, optimizer, x, y):
    """A correct step: one averaged all-reduce of every gradient, the global loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    all_reduce_flat([p.grad for p in model.parameters()], average=True)
    optimizer.step()
    total = loss.detach().reshape(1)
    all_reduce_flat([total], average=True)
    return total.item()


def test_inspect_train_step_finds_each_bug_and_nothing_in_a_correct_step():
    buggy = debugging.inspect_train_step(_buggy_step, 2, timeout=60)
    step, found = buggy.inconsistency
    assert step == 0 and found.name.endswith("bias")
    ratios = [r for n, r in buggy.update_ratio.items() if not n.endswith("bias")]
    assert all(abs(r - 2) < 1e-3 for r in ratios), ratios          # summed over 2 ranks
    assert buggy.losses[0] != buggy.losses[1] and len(buggy.findings) == 4
    good = debugging.inspect_train_step(_flat_step, 2, timeout=60)
    assert good.inconsistency is None and good.findings == [], good.findings
    with pytest.raises(TypeError):
        debugging.inspect_train_step("not a function")
    with pytest.raises(ValueError):
        debugging.inspect_train_step(_flat_step, 3, batch_size=8)


def test_short_paths_names_files_from_the_course_root_and_the_package():
    root = os.path.dirname(os.path.dirname(os.path.abspath(lecture_lib.__file__)))
    text = (f'File "{os.path.join(root, "lecture_lib", "x.py")}", line 1\n'
            'File "/usr/lib/python3.11/site-packages/torch/distributed/c10d.py", line 2')
    assert debugging.short_paths(text) == ('File "lecture_lib/x.py", line 1\n'
                                           'File "torch/distributed/c10d.py", line 2')
