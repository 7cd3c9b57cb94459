"""Expert parallelism: the MoE layer on 1, 2 and 4 ranks equals the one-process layer
(outputs, aux loss, dropped tokens, gradients; rtol 1e-5), the MoE GPT trains equal to
one process, bad configurations fail before any rank starts."""
import math

import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import comm, costmodel
from lecture_lib import expert_parallel as ep
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
        y = layer(x)
        ((y * up_all[rows].to(dev)).sum() + 0.5 * layer.aux_loss).backward()
        router_grad = layer.router.weight.grad
        if size > 1:
            dist.all_reduce(router_grad, group=g)
        out.append({
            "y": y.detach().cpu(), "x_grad": x.grad.cpu(), "aux": layer.aux_loss.item(),
            "kept": layer.stats["kept"], "expert_index": layer.stats["expert_index"],
            "router_grad": router_grad.cpu(),
            "expert_grads": {n: p.grad.cpu() for n, p in layer.experts.named_parameters()},
            "stats": {key: layer.stats[key] for key in ("send_splits", "recv_splits",
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


def test_capacity_drops_in_global_order():
    """Every token to expert 0: C = ceil(cf k T / E) slots kept, the first C tokens."""
    layer = ep.MoELayer(D, F, 4, 1, 1.0, group=ep.LOCAL, seed=0)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0] = 1.0
    x = torch.rand(TOKENS, D) + 1.0                      # positive: expert 0 wins, p ~ 1
    y = layer(x)
    cap = ep.expert_capacity(TOKENS, 4, 1, 1.0)
    assert cap == 16 and layer.stats["capacity"] == 16
    kept = layer.stats["kept"][:, 0]
    assert kept[:cap].all() and not kept[cap:].any()
    assert torch.equal(y[cap:], torch.zeros_like(y[cap:])) and y[:cap].abs().sum() > 0
    assert layer.stats["dropped_fraction"] == pytest.approx(1 - 1 / 4)
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
    layer(torch.rand(TOKENS, D) + 1.0)
    kept = layer.stats["kept"]
    assert kept[:TOKENS // 2].all() and not kept[TOKENS // 2:].any()
    assert torch.all(layer.stats["gates"].sum(1).sub(1).abs() < 1e-6)  # top-2 renormalised


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
    return log.summary(), layer.stats["buffer_bytes"], comm.recording()


def test_exchanges_are_recorded_when_a_recorder_is_on():
    for summary, buffer_bytes, still_on in lecture_lib.run(_recorded_forward, 2, timeout=60):
        assert summary["counts"]["all_gather"][0] == 1                # one count exchange
        assert summary["dispatch"] == {"all_to_all": (1, buffer_bytes)}
        assert summary["combine"]["all_to_all"][0] == 1
        assert summary["backward"]["all_to_all"][0] == 2              # both, reversed
        assert not still_on
