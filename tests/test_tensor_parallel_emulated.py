"""lecture_lib.tensor_parallel.emulated: one tensor-parallel layer timed at real size.

The dry run (fake tensors) must read exactly the clock a run on real tensors reads, for the
very rank function the real-size experiment runs (``layer_step``), with and without
sequence parallelism; the real-size sweep must charge the bytes the formula gives and show
the communication share growing with tp, and faster on InfiniBand than on NVLink.
"""
import pytest
import torch

import lecture_lib
from lecture_lib import costmodel, emulate, models
from lecture_lib.tensor_parallel import emulated as tp_emulated

SMALL = models.GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_heads=4, n_layers=1)
LLAMA = models.GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_heads=4, n_layers=1,
                         n_kv_heads=2, d_ff=48, mlp="swiglu")


def _real_and_dry(fn, *args):
    """``fn`` under the emulation on real tensors, then in the dry run: each clock (all it
    knows: now, totals, bytes, spans, issue times) and what ``fn`` returned."""
    out = {}
    for dry_run in (False, True):
        with emulate.emulated("h100-node", dry_run=dry_run) as clock:
            result = fn(*args)
        out[dry_run] = ({**clock.summary(), "issued": list(clock.issued)}, result)
    return out


@pytest.mark.parametrize("cfg,sp", [(SMALL, False), (SMALL, True), (LLAMA, True)],
                         ids=["block", "block, sequence parallel",
                              "llama block, sequence parallel"])
def test_the_layer_steps_dry_clock_equals_the_real_ones(cfg, sp):
    for rank in lecture_lib.run(_real_and_dry, 2, tp_emulated.layer_step, cfg, 2, sp,
                                timeout=120):
        (real, real_split), (dry, dry_split) = rank[False], rank[True]
        assert real["now"] > 0 and real["comm_bytes"] > 0
        assert dry == real                              # the whole clock, to the last bit
        assert dry_split == real_split
        kinds = {"all_gather", "reduce_scatter"} if sp else {"all_reduce"}
        assert set(real_split["calls"]) == kinds


def test_layer_step_needs_the_emulation():
    with pytest.raises(RuntimeError, match="emulated clock"):
        tp_emulated.layer_step(SMALL)


def test_a_gpt3_layer_at_real_size_charges_the_formulas_bytes_and_the_share_grows():
    cfg = models.real_size("GPT-3 175B", n_layers=1)
    rows = tp_emulated.time_at_scale(cfg, (1, 2), timeout=120)
    by = {(r["tp"], r["link"]): r for r in rows}
    assert list(by) == [(1, "NVLink"), (2, "NVLink"), (2, "InfiniBand")]   # tp = 1 once
    assert by[(1, "NVLink")]["comm_s"] == 0 and by[(1, "NVLink")]["mfu"] > 0.6
    formula = costmodel.tp_block_comm(1, cfg.seq_len, cfg.d_model, 2, 2)
    calls, nbytes = formula["forward"]["all_reduce"]
    calls_b, nbytes_b = formula["backward"]["all_reduce"]
    for link in ("NVLink", "InfiniBand"):
        row = by[(2, link)]
        assert row["calls"] == {"all_reduce": calls + calls_b}
        assert row["bytes"] == {"all_reduce": calls * nbytes + calls_b * nbytes_b}   # bf16
        assert row["exposed_s"] == pytest.approx(row["comm_s"], rel=1e-9)     # blocking
    assert 0 < by[(2, "NVLink")]["comm_share"] < by[(2, "InfiniBand")]["comm_share"]
    assert by[(2, "NVLink")]["step_s"] < by[(1, "NVLink")]["step_s"] / 1.8  # compute halves


@pytest.mark.parametrize("kwargs,message", [
    (dict(tps=(5,)), "divisible"),
    (dict(tps=()), "at least one"),
    (dict(tps=(2,), sequence_parallel="yes"), "sequence_parallel"),
    (dict(tps=(2,), links={}), "non-empty"),
    (dict(tps=(2,), links={"x": "h200-node"}), "unknown emulation"),
    (dict(tps=(2,), batch=0), "batch"),
])
def test_time_at_scale_refuses_bad_input_before_any_process(monkeypatch, kwargs, message):
    monkeypatch.setattr(emulate, "run", lambda *a, **k: pytest.fail("ranks started"))
    with pytest.raises(ValueError, match=message):
        tp_emulated.time_at_scale(models.real_size("GPT-3 175B", n_layers=1), **kwargs)


def test_the_dry_run_computes_nothing():
    cfg = models.real_size("Llama 3 70B", n_layers=1)
    with emulate.emulated("h100-node", dry_run=True):
        split = tp_emulated.layer_step(cfg)
    assert split["flops"] > 1e12 and split["step_s"] > 1e-3 and not torch.is_tensor(split["flops"])
