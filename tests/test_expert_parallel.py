"""Expert parallelism: the MoE layer on 1, 2 and 4 ranks equals the one-process layer
(outputs, aux loss, dropped tokens, gradients; rtol 1e-5), with the learned router and with
a routing fixed before the step; the MoE GPT trains equal to one process; bad
configurations fail before any rank starts; the dry run reads the emulated real run's clock
exactly, and times Mixtral's layer at real size."""
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import comm, costmodel, emulate, observe
from lecture_lib import expert_parallel as ep
from lecture_lib.expert_parallel import emulated as epe
from lecture_lib.expert_parallel import experiments as epx
from lecture_lib.models import GPTConfig, MarkovText, assert_same_training, train_reference

RTOL, ATOL = 1e-5, 1e-6
TOKENS, D, F = 64, 16, 32
# (num_experts, k, capacity_factor): Switch top-1 with dropping, top-2 with dropping, dropless
CASES = [(4, 1, 1.0), (8, 2, 1.25), (4, 2, None)]


def _data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(TOKENS, D, generator=g)
    upstream = torch.randn(TOKENS, D, generator=g)    # d(loss)/d(output), fixed
    return x, upstream


def _layer_results(group):
    """Run every case on this process's shard; what the reference is compared with."""
    g, rank, size = comm.resolve(group)
    x_all, up_all = _data()
    rows = slice(rank * TOKENS // size, (rank + 1) * TOKENS // size)
    dev = lecture_lib.device()
    out = []
    for num_experts, k, cf in CASES:
        layer = ep.MoELayer(D, F, num_experts, k, cf, group=group, seed=3)
        x = x_all[rows].clone().to(dev).requires_grad_()
        with observe.watch() as seen:
            y = layer(x)
        stats = epx.routing_stats(seen.notes("routing")[-1])
        ((y * up_all[rows].to(dev)).sum() + 0.5 * layer.aux_loss).backward()
        router_grad = layer.router.weight.grad
        if size > 1:
            dist.all_reduce(router_grad, group=g)
        out.append({
            "y": y.detach().cpu(), "x_grad": x.grad.cpu(), "aux": layer.aux_loss.item(),
            "kept": stats["kept"], "expert_index": stats["expert_index"],
            "router_grad": router_grad.cpu(),
            "expert_grads": {n: p.grad.cpu() for n, p in layer.experts.named_parameters()},
            "stats": {key: stats[key] for key in ("send_splits", "recv_splits",
                                                  "sent_bytes", "dropped_fraction",
                                                  "tokens_per_expert")},
        })
    return out


@pytest.fixture(scope="module")
def reference():
    return _layer_results(ep.LOCAL)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_layer_equals_one_process(world_size, reference):
    results = lecture_lib.run(_layer_results, world_size, None, timeout=120)
    n = TOKENS // world_size
    for case, ref in enumerate(reference):
        what = f"case {CASES[case]} on {world_size} ranks"
        # top-1 at capacity factor 1 drops some tokens here; dropless drops none
        dropped = ref["stats"]["dropped_fraction"]
        assert dropped > 0 if CASES[case] == (4, 1, 1.0) else True, what
        assert dropped == 0 if CASES[case][2] is None else True, what
        for rank, res in enumerate(results):
            rows = slice(rank * n, (rank + 1) * n)
            assert torch.equal(res[case]["expert_index"], ref["expert_index"][rows]), what
            assert torch.equal(res[case]["kept"], ref["kept"][rows]), f"dropped tokens, {what}"
            torch.testing.assert_close(res[case]["y"], ref["y"][rows], rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(res[case]["x_grad"], ref["x_grad"][rows],
                                       rtol=RTOL, atol=ATOL)
            assert math.isclose(res[case]["aux"], ref["aux"], rel_tol=RTOL), what
            torch.testing.assert_close(res[case]["router_grad"], ref["router_grad"],
                                       rtol=RTOL, atol=ATOL)
        grads = {}
        for res in results:                      # each expert's gradient lives on its rank
            assert not set(grads) & set(res[case]["expert_grads"]), "an expert on two ranks"
            grads.update(res[case]["expert_grads"])
        assert grads.keys() == ref["expert_grads"].keys(), what
        for name, g in ref["expert_grads"].items():
            torch.testing.assert_close(grads[name], g, rtol=RTOL, atol=ATOL, msg=name)
        # the exchanged split sizes agree: what r sends to s, s receives from r
        for r, res in enumerate(results):
            for s, other in enumerate(results):
                sent, got = res[case]["stats"], other[case]["stats"]
                assert sent["send_splits"][s] == got["recv_splits"][r]
        assert ref["stats"]["sent_bytes"] == 0


def _forward(layer, x):
    """The layer's output and what it routed (its "routing" note, watched)."""
    with observe.watch() as seen:
        y = layer(x)
    return y, epx.routing_stats(seen.notes("routing")[-1])


def test_capacity_drops_in_global_order():
    """Every token to expert 0: C = ceil(cf k T / E) slots kept, the first C tokens."""
    layer = ep.MoELayer(D, F, 4, 1, 1.0, group=ep.LOCAL, seed=0)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0] = 1.0
    x = torch.rand(TOKENS, D) + 1.0                      # positive: expert 0 wins, p ~ 1
    y, stats = _forward(layer, x)
    cap = ep.expert_capacity(TOKENS, 4, 1, 1.0)
    assert cap == 16 and stats["capacity"] == 16
    kept = stats["kept"][:, 0]
    assert kept[:cap].all() and not kept[cap:].any()
    assert torch.equal(y[cap:], torch.zeros_like(y[cap:])) and y[:cap].abs().sum() > 0
    assert stats["dropped_fraction"] == pytest.approx(1 - 1 / 4)
    assert layer.aux_loss.item() == pytest.approx(4.0, rel=1e-3)      # collapse: aux -> E
    with torch.no_grad():
        layer.router.weight.zero_()                                  # even probabilities
    layer(x)
    assert layer.aux_loss.item() == pytest.approx(1.0)               # sum_e f_e = 1, P_e = 1/E


def test_second_choices_queue_after_first_choices():
    layer = ep.MoELayer(D, F, 2, 2, 0.5, group=ep.LOCAL, seed=0)      # C = ceil(.5*2*T/2) = T/2
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0] = 1.0                                 # first choice 0, second 1
    _, stats = _forward(layer, torch.rand(TOKENS, D) + 1.0)
    kept = stats["kept"]
    assert kept[:TOKENS // 2].all() and not kept[TOKENS // 2:].any()
    assert torch.all(stats["gates"].sum(1).sub(1).abs() < 1e-6)      # top-2 renormalised


def _train_small(world_size, moe, steps=3):
    """SGD: AdamW divides a gradient by its own size, so on a parameter whose true gradient
    is 0 (the attention's key bias: softmax ignores it) it turns summation-order rounding
    (1e-10) into full-size steps; SGD keeps rounding at rounding size."""
    cfg = GPTConfig(vocab_size=32, seq_len=8, d_model=32, n_heads=2, n_layers=2)
    got = epx.train_expert_parallel(cfg, moe, world_size, steps, batch_size=8, lr=0.5,
                                    optimizer="sgd", timeout=120)
    data = MarkovText(cfg.vocab_size, cfg.seq_len, seed=0)
    ref = train_reference(ep.MoEGPT(cfg, moe, 0, group=ep.LOCAL), lambda s: data.batch(s, 8),
                          steps, lr=0.5, optimizer="sgd")
    return got, ref


@pytest.mark.parametrize("world_size,moe", [(2, ep.MoEConfig(4, 1, 1.0, aux_weight=0.1)),
                                            (4, ep.MoEConfig(4, 2, 1.0, aux_weight=0.01))])
def test_moe_gpt_trains_equal_to_one_process(world_size, moe):
    got, ref = _train_small(world_size, moe)
    assert_same_training(got, ref, rtol=RTOL, atol=ATOL)
    assert got.tokens_per_expert.shape == (3, 2, moe.num_experts)
    assert (got.tokens_per_expert.sum(-1) == 8 * 8 * moe.k).all()   # every token slot counted
    assert (got.dropped > 0).any()                                  # capacity 1.0 does drop


def test_bad_input_fails_before_any_rank_starts(monkeypatch):
    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks were started for a bad configuration")
    monkeypatch.setattr(ep.experiments, "run", no_ranks)
    cfg = GPTConfig(vocab_size=32, seq_len=8, d_model=32, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match="divisible"):
        epx.train_expert_parallel(cfg, ep.MoEConfig(6, 1), 4, 1, batch_size=8)
    with pytest.raises(ValueError, match="batch_size"):
        epx.train_expert_parallel(cfg, ep.MoEConfig(4, 1), 4, 1, batch_size=6)
    with pytest.raises(ValueError, match="larger than the number of experts"):
        ep.MoEConfig(4, 5)
    for cf in (0, -1.0, "1"):
        with pytest.raises(ValueError, match="capacity_factor"):
            ep.MoEConfig(4, 1, cf)
    with pytest.raises(ValueError, match="larger than the number of experts"):
        ep.MoELayer(D, F, 2, 3, group=ep.LOCAL)
    with pytest.raises(ValueError, match="num_experts"):
        ep.check_moe(0)
    with pytest.raises(ValueError, match="split"):
        ep.all_to_all(torch.zeros(3, 2), [2], [3], group=ep.LOCAL)


def _layer_on_wrong_group():
    ep.MoELayer(D, F, 3, 1, group=None)        # 3 experts over 2 ranks


def test_rank_side_error_names_the_problem():
    with pytest.raises(lecture_lib.RankError, match="divisible"):
        lecture_lib.run(_layer_on_wrong_group, 2, timeout=60)


def test_costmodel_counts_match_the_layer():
    layer = ep.MoELayer(D, F, 8, 2, group=ep.LOCAL)
    assert costmodel.moe_params(D, F, 8) == sum(p.numel() for p in layer.parameters())
    assert costmodel.mlp_params(D, F) == sum(p.numel() for p in layer.experts["0"].parameters())
    # per token: k experts of 2 matmuls (2 FLOPs per multiply-add) + the router
    assert costmodel.moe_flops_per_token(D, F, 8, 2) == 2 * 2 * (2 * D * F) + 2 * D * 8
    assert costmodel.all_to_all_bytes(100, D, 2, 4) == pytest.approx(0.75 * 100 * 2 * D * 4)
    assert costmodel.all_to_all_bytes(100, D, 2, 1) == 0
    with pytest.raises(ValueError):
        costmodel.moe_flops_per_token(D, F, 2, 3)


def test_drop_rates_fall_with_capacity_and_match_the_layer():
    cfg = GPTConfig(vocab_size=32, seq_len=8, d_model=32, n_heads=2, n_layers=2)
    moe = ep.MoEConfig(4, 1, 1.0)
    params = dict(ep.MoEGPT(cfg, moe, 0, group=ep.LOCAL).named_parameters())
    rates = epx.measure_drop_rates(cfg, moe, params, [0.25, 0.5, 1.0, 4.0], batch_size=8)
    assert rates.shape == (4, 2)
    assert (rates[1:] <= rates[:-1]).all() and (rates[-1] == 0).all()
    assert torch.allclose(rates[0], torch.full((2,), 0.75))          # C = T/16: 3/4 dropped
    with pytest.raises(ValueError, match="capacity_factor"):
        epx.measure_drop_rates(cfg, moe, params, [1.0, 0.0])


def test_benchmark_layer_times_every_phase_and_counts_bytes():
    with pytest.raises(ValueError, match="divisible"):
        epx.benchmark_layer(4, tokens=66)
    with pytest.raises(ValueError, match="divisible"):
        epx.benchmark_layer(4, num_experts=6)
    res = epx.benchmark_layer(2, tokens=256, d_model=16, d_ff=32, num_experts=4, repeats=2,
                              timeout=60)
    for rank, r in enumerate(res):
        assert set(r["seconds"]) == {"route", "counts", "dispatch", "experts", "combine"}
        assert all(t > 0 for t in r["seconds"].values())
        splits = r["stats"]["send_splits"]
        assert r["stats"]["sent_bytes"] == (sum(splits) - splits[rank]) * 16 * 4
        assert {kind for kind, *_ in r["spans"]} == set(r["seconds"])


def test_benchmark_layer_sweep_checks_every_world_size_before_starting():
    with pytest.raises(ValueError, match="divisible by 4 ranks"):
        epx.benchmark_layer_sweep((1, 4), tokens=66)
    res = epx.benchmark_layer_sweep((1,), tokens=64, d_model=8, d_ff=16, num_experts=2,
                                    repeats=1, timeout=60)
    assert list(res) == [1] and set(res[1][0]["seconds"]) >= {"route", "experts"}


def _recorded_forward():
    layer = ep.MoELayer(D, F, 4, 1, None, seed=0)
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(TOKENS // 2, D, generator=g).to(lecture_lib.device()).requires_grad_()
    layer(x).sum().backward()                      # no recorder on: nothing kept
    with comm.record_comm() as log:
        layer(x).sum().backward()
    buffer_bytes = epx.routing_sizes(log.watcher.notes("routing")[-1])["buffer_bytes"]
    return log.summary(), buffer_bytes, comm.recording()


def test_exchanges_are_recorded_when_a_recorder_is_on():
    for summary, buffer_bytes, still_on in lecture_lib.run(_recorded_forward, 2, timeout=60):
        assert summary["counts"]["all_gather"][0] == 1                # one count exchange
        assert summary["dispatch"] == {"all_to_all": (1, buffer_bytes)}
        assert summary["combine"]["all_to_all"][0] == 1
        assert summary["backward"]["all_to_all"][0] == 2              # both, reversed
        assert not still_on


# ----------------------------------------------------------------------------
# A routing fixed before the step: equal to one process, and what the dry run needs
# ----------------------------------------------------------------------------

def test_drawn_choices_are_distinct_balanced_or_skewed():
    balanced = ep.draw_choices(64, 8, 2)
    assert balanced.shape == (64, 2) and (balanced[:, 0] != balanced[:, 1]).all()
    assert ep.count_table(balanced, 8) == [[8] * 8, [8] * 8]        # T k / E slots each
    drawn = ep.draw_choices(4096, 8, 2, seed=5, skew=1.0)
    assert (drawn == ep.draw_choices(4096, 8, 2, seed=5, skew=1.0)).all()   # the seed fixes it
    assert (drawn[:, 0] != drawn[:, 1]).all()
    per_expert = [sum(c) for c in zip(*ep.count_table(drawn, 8))]
    assert per_expert == sorted(per_expert, reverse=True) and per_expert[0] > 2 * 4096 * 2 / 8
    uniform = [sum(c) for c in zip(*ep.count_table(ep.draw_choices(4096, 8, 1, seed=5), 8))]
    assert max(uniform) < 1.15 * 4096 / 8
    with pytest.raises(ValueError, match="larger than the number of experts"):
        ep.draw_choices(8, 2, 3)


def _fixed_layer(group, num_experts, k, cf, routing):
    """The layer with a routing fixed before the step, forward and backward on this rank's
    shard; what is compared with one process."""
    g, rank, size = comm.resolve(group)
    x_all, up_all = _data()
    rows = slice(rank * TOKENS // size, (rank + 1) * TOKENS // size)
    choices = ep.draw_choices(TOKENS, num_experts, k, **routing)
    layer = ep.MoELayer(D, F, num_experts, k, cf, group=group, seed=3, mlp="swiglu")
    layer.choose_experts = ep.FixedRouting(np.split(choices, size), rank, num_experts)
    x = x_all[rows].clone().to(lecture_lib.device()).requires_grad_()
    with observe.watch() as seen:
        y = layer(x)
    ((y * up_all[rows].to(x.device)).sum() + 0.5 * layer.aux_loss).backward()
    note = seen.notes("routing")[-1]
    router_grad = layer.router.weight.grad
    if size > 1:
        dist.all_reduce(router_grad, group=g)
    return {"y": y.detach().cpu(), "x_grad": x.grad.cpu(), "aux": layer.aux_loss.item(),
            "router_grad": router_grad.cpu(), "kept": note["admission"].keep.cpu(),
            "expert": note["routing"].expert.cpu(), "choices": choices[rows],
            # the table every rank knew before the step against the one the tensors count
            "counted": note["routing"].counts.tolist(), "known": note["routing"].counts_all,
            "experts": {n: p.grad.cpu() for n, p in layer.experts.named_parameters()}}


@pytest.mark.parametrize("num_experts,k,cf,routing", [
    (4, 2, 1.0, {"seed": 1, "skew": 1.5}),      # skewed: the popular experts drop slots
    (8, 1, None, {}),                           # balanced, dropless
])
def test_fixed_routing_equals_one_process(num_experts, k, cf, routing):
    ref = _fixed_layer(ep.LOCAL, num_experts, k, cf, routing)
    assert (ref["expert"].numpy() == ref["choices"]).all()
    assert (not ref["kept"].all()) if cf is not None else ref["kept"].all()
    for world_size in (2, 4):
        results = lecture_lib.run(_fixed_layer, world_size, None, num_experts, k, cf, routing,
                                  timeout=120)
        n = TOKENS // world_size
        experts = {}
        for rank, res in enumerate(results):
            rows = slice(rank * n, (rank + 1) * n)
            assert res["counted"] == res["known"][rank]
            assert torch.equal(res["kept"], ref["kept"][rows])
            torch.testing.assert_close(res["y"], ref["y"][rows], rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(res["x_grad"], ref["x_grad"][rows], rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(res["router_grad"], ref["router_grad"], rtol=RTOL,
                                       atol=ATOL)
            assert math.isclose(res["aux"], ref["aux"], rel_tol=RTOL)
            experts.update(res["experts"])
        assert experts.keys() == ref["experts"].keys()
        for name, grad in ref["experts"].items():
            torch.testing.assert_close(experts[name], grad, rtol=RTOL, atol=ATOL, msg=name)


def _real_and_dry(cfg, moe, tokens, routing, dtype):
    """The layer's forward and backward emulated, on real tensors and then on fake ones."""
    out = {}
    for dry_run in (False, True):
        with emulate.emulated("h100-node", dry_run=dry_run) as clock:
            passed = epx.layer_pass(cfg, moe, tokens, routing, True, 1, 0, dtype)
        out[dry_run] = ({**clock.summary(), "issued": list(clock.issued)}, passed["stats"])
    return out


SMALL = GPTConfig(vocab_size=1, seq_len=1, d_model=32, n_heads=1, n_layers=1, d_ff=64)


@pytest.mark.parametrize("case", ["top-2 skewed, capacity 1, SwiGLU",
                                  "top-1 balanced, dropless, bf16",
                                  "top-2 drawn on 4 ranks, capacity 1.25"])
def test_the_dry_run_reads_the_real_runs_clock_exactly(case):
    cfg, moe, routing, dtype, ranks = {
        "top-2 skewed, capacity 1, SwiGLU": (replace(SMALL, mlp="swiglu"), ep.MoEConfig(4, 2, 1.0),
                                             {"seed": 0, "skew": 1.0}, torch.float32, 2),
        "top-1 balanced, dropless, bf16": (SMALL, ep.MoEConfig(4, 1, None), {}, torch.bfloat16, 2),
        "top-2 drawn on 4 ranks, capacity 1.25": (SMALL, ep.MoEConfig(8, 2, 1.25), {"seed": 3},
                                                  torch.float32, 4)}[case]
    for rank in lecture_lib.run(_real_and_dry, ranks, cfg, moe, 16, routing, dtype, timeout=120):
        (real, real_stats), (dry, dry_stats) = rank[False], rank[True]
        assert real["now"] > 0 and real["bytes_by_kind"]["all_to_all"] > 0
        assert real_stats == dry_stats                     # split sizes fixed before the step
        assert dry == real                    # now, totals, bytes, spans, issue times
    if "skewed" in case:
        assert real_stats["dropped_fraction"] > 0


def test_mixtral_layer_at_real_size_in_the_dry_run():
    """Mixtral 8x7B's MoE layer (h 4096, 8 SwiGLU experts of 14336, top-2, bf16, 8192 tokens
    per GPU) on 2 emulated H100s: every all-to-all sends half its rows away; over
    InfiniBand (one GPU per node) the same all-to-alls take longer."""
    with pytest.raises(ValueError, match="divisible"):
        epe.time_at_scale(3)
    nvlink = epe.time_at_scale(2)
    one = costmodel.all_to_all_bytes(8192, 4096, 2, 2, bytes_per_element=2)   # the closed form
    for r in nvlink["ranks"]:
        assert r["sent_bytes"] == 4 * one == 4 * 8192 * 2 * 4096 * 2 // 2   # dispatch, combine,
        # and both again in backward: each sends (p - 1) / p of the rows, bf16
        assert r["step"] == pytest.approx(r["compute"] + r["exposed"])
        assert r["all_to_all"] <= r["exposed"]
    assert 5e-3 < nvlink["step"] < 0.2 and 0 < nvlink["all_to_all_share"] < 0.2
    assert nvlink["link"] == "NVLink" and nvlink["wall_seconds"] < 60
    infiniband = epe.time_at_scale(2, gpus_per_node=1)
    assert infiniband["link"] == "InfiniBand"
    assert infiniband["all_to_all_share"] > 2 * nvlink["all_to_all_share"]
