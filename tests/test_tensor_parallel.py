"""Tensor parallelism equals one device: every layer (forward, input and weight gradients,
rtol 1e-5) at tp = 2 and 4, the whole GPT's training, the counted bytes against the formula,
DTensor's outputs; bad input fails before any communication."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import lecture_lib
from lecture_lib import costmodel, models
from lecture_lib import tensor_parallel as tp_lib
from lecture_lib.comm import record_comm
from lecture_lib.mesh import RankGrid
from lecture_lib.tensor_parallel import experiments as tpx

RTOL, ATOL = 1e-5, 1e-6
CFG = models.GPTConfig(vocab_size=32, seq_len=8, d_model=32, n_heads=4, n_layers=2)
# Llama's shape: grouped-query attention (2 query heads per key/value head) and SwiGLU
LLAMA = models.GPTConfig(vocab_size=32, seq_len=8, d_model=32, n_heads=8, n_layers=2,
                         n_kv_heads=4, d_ff=48, mlp="swiglu")


# Each claim: one function a rank runs, returning ``[(what, got, expected), ...]`` (the parallel
# layer's value beside its one-device original's). The rank runs every claim, each on its own
# random data, and an exception in one is that claim's failure alone.

def _my_columns(t):
    return t.chunk(dist.get_world_size(), -1)[dist.get_rank()]


def _my_positions(t):                       # this rank's part of the sequence
    return t.chunk(dist.get_world_size(), 1)[dist.get_rank()]


def _grads(module, ref_module):
    full = tp_lib.gather_full(module, grads=True)
    return [(f"grad {n}", full[n], ref.grad.clone()) for n, ref in ref_module.named_parameters()]


def _compare(module, ref_module, x_full, g, local_in=None, local_out=None):
    """Forward both, weight the outputs by random ``R`` (every output element then matters
    for the gradients), backward; the output, the input's gradient and every weight's."""
    x_ref = x_full.clone().requires_grad_(True)
    y_ref = ref_module(x_ref)
    weights = torch.randn(y_ref.shape, generator=g)
    (y_ref * weights).sum().backward()
    x = (local_in(x_full) if local_in else x_full).clone().requires_grad_(True)
    y = module(x)
    (y * (local_out(weights) if local_out else weights)).sum().backward()
    tp_lib.sync_sequence_parallel_grads(module)
    exp_in = local_in(x_ref.grad) if local_in else x_ref.grad
    exp_out = local_out(y_ref.detach()) if local_out else y_ref.detach()
    return [("output", y.detach(), exp_out), ("input grad", x.grad, exp_in)] + _grads(
        module, ref_module)


def _column_gathered(cfg, g):
    return _compare(tp_lib.ColumnParallelLinear(16, 24, gather_output=True, seed=3),
                    tp_lib.seeded_linear(16, 24, seed=3), torch.randn(3, cfg.seq_len, 16,
                                                                      generator=g), g)


def _column_split(cfg, g):
    full = tp_lib.seeded_linear(16, 24, seed=3)
    return _compare(tp_lib.ColumnParallelLinear.from_linear(full), full,
                    torch.randn(3, cfg.seq_len, 16, generator=g), g, local_out=_my_columns)


def _row_from_full_input(cfg, g):
    return _compare(tp_lib.RowParallelLinear(24, 16, input_is_parallel=False, seed=4),
                    tp_lib.seeded_linear(24, 16, seed=4), torch.randn(3, cfg.seq_len, 24,
                                                                      generator=g), g)


def _row_split_input(cfg, g):
    full = tp_lib.seeded_linear(24, 16, seed=4)
    return _compare(tp_lib.RowParallelLinear.from_linear(full), full,
                    torch.randn(3, cfg.seq_len, 24, generator=g), g, local_in=_my_columns)


def _gpt_and_hidden(cfg, g):
    return models.GPT(cfg, seed=5), torch.randn(3, cfg.seq_len, cfg.d_model, generator=g)


def _mlp(cfg, g):
    gpt, h = _gpt_and_hidden(cfg, g)
    return _compare(tp_lib.ParallelMLP(gpt.blocks[0].mlp), gpt.blocks[0].mlp, h, g)


def _attention(cfg, g):
    gpt, h = _gpt_and_hidden(cfg, g)
    return _compare(tp_lib.ParallelSelfAttention(gpt.blocks[0].attn), gpt.blocks[0].attn, h, g)


def _block(cfg, g):
    gpt, h = _gpt_and_hidden(cfg, g)
    return _compare(tp_lib.ParallelBlock(gpt.blocks[1]), gpt.blocks[1], h, g)


def _block_sequence_parallel(cfg, g):
    gpt, h = _gpt_and_hidden(cfg, g)
    return _compare(tp_lib.SequenceParallelBlock(gpt.blocks[1]), gpt.blocks[1],
                    h, g, local_in=_my_positions, local_out=_my_positions)


def _gqa_attention(cfg, g):
    gpt, h = _gpt_and_hidden(LLAMA, g)
    return _compare(tp_lib.ParallelSelfAttention(gpt.blocks[0].attn), gpt.blocks[0].attn, h, g)


def _swiglu_mlp(cfg, g):
    gpt, h = _gpt_and_hidden(LLAMA, g)
    return _compare(tp_lib.ParallelMLP(gpt.blocks[0].mlp), gpt.blocks[0].mlp, h, g)


def _llama_block_sequence_parallel(cfg, g):
    gpt, h = _gpt_and_hidden(LLAMA, g)
    return _compare(tp_lib.SequenceParallelBlock(gpt.blocks[1]), gpt.blocks[1],
                    h, g, local_in=_my_positions, local_out=_my_positions)


def _vocab_embedding(cfg, g):
    """Integer input, so no input gradient."""
    gpt = models.GPT(cfg, seed=5)
    idx = torch.randint(cfg.vocab_size, (3, cfg.seq_len), generator=g)
    emb = tp_lib.VocabParallelEmbedding(gpt.tok_emb)
    y, y_ref = emb(idx), gpt.tok_emb(idx)
    weights = torch.randn(y_ref.shape, generator=g)
    (y * weights).sum().backward()
    (y_ref * weights).sum().backward()
    return [("output", y.detach(), y_ref.detach())] + _grads(emb, gpt.tok_emb)


def _vocab_cross_entropy(cfg, g):
    """Against ``F.cross_entropy`` on the full logits."""
    idx = torch.randint(cfg.vocab_size, (3, cfg.seq_len), generator=g)
    logits = torch.randn(3, cfg.seq_len, cfg.vocab_size, generator=g) * 3
    z_ref = logits.clone().requires_grad_(True)
    loss_ref = F.cross_entropy(z_ref.reshape(-1, cfg.vocab_size), idx.reshape(-1))
    loss_ref.backward()
    z = _my_columns(logits).clone().requires_grad_(True)
    loss = tp_lib.vocab_parallel_cross_entropy(z, idx).mean()
    loss.backward()
    return [("loss", loss.detach(), loss_ref.detach()),
            ("logits grad", z.grad, _my_columns(z_ref.grad))]


def _gpt_loss(cfg, g):
    """The whole model's loss; the rank holds only its vocabulary slice of the logits."""
    gpt = models.GPT(cfg, seed=5)
    idx = torch.randint(cfg.vocab_size, (3, cfg.seq_len), generator=g)
    return [("loss", tp_lib.TensorParallelGPT(gpt)(idx, idx).detach(), gpt(idx, idx).detach())]


CLAIMS = {"column gathered": _column_gathered, "column split": _column_split,
          "row from full input": _row_from_full_input, "row split input": _row_split_input,
          "mlp": _mlp, "attention": _attention, "block": _block,
          "block, sequence parallel": _block_sequence_parallel,
          "gqa attention": _gqa_attention, "swiglu mlp": _swiglu_mlp,
          "llama block, sequence parallel": _llama_block_sequence_parallel,
          "vocab embedding": _vocab_embedding, "vocab cross-entropy": _vocab_cross_entropy,
          "gpt loss": _gpt_loss}


def _comm_and_checks(cfg, batch):
    """On every rank: each claim's checks (or the exception it raised, as text), the shape of
    the logits a rank holds, and each block's counted communication."""
    checks = {}
    for number, (layer, claim) in enumerate(CLAIMS.items()):
        try:
            checks[layer] = claim(cfg, torch.Generator().manual_seed(number))
        except Exception as exc:              # that claim's test fails with it; the rest run
            checks[layer] = f"{type(exc).__name__}: {exc}"
    idx = torch.zeros(3, cfg.seq_len, dtype=torch.long)
    logits_shape = tuple(tp_lib.TensorParallelGPT(models.GPT(cfg, seed=5))(idx).shape)
    blocks = {sp: tpx.measure_block(cfg, batch, sequence_parallel=sp) for sp in (False, True)}
    return checks, logits_shape, blocks


@pytest.fixture(scope="module", params=[2, 4], ids=lambda tp: f"tp{tp}")
def measured(request):
    tp = request.param
    return tp, lecture_lib.run(_comm_and_checks, tp, CFG, 2, timeout=120)


@pytest.mark.parametrize("layer", CLAIMS)
def test_layer_equals_one_device(measured, layer):
    """One test per claim (and per tp): a claim that raised on a rank fails here with its
    exception; the others are checked all the same."""
    tp, results = measured
    for rank, (checks, _, _) in enumerate(results):
        assert not isinstance(checks[layer], str), f"tp={tp} rank {rank} {layer}: {checks[layer]}"
        assert checks[layer], layer
        for what, got, expected in checks[layer]:
            where = f"tp={tp} rank {rank} {layer} {what}"
            torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL,
                                       msg=lambda m, where=where: f"{where}: {m}")


def test_no_rank_holds_the_full_logits(measured):
    tp, results = measured
    for _, shape, _ in results:
        assert shape == (3, CFG.seq_len, CFG.vocab_size // tp)


@pytest.mark.parametrize("sp", [False, True], ids=["plain", "sequence-parallel"])
def test_counted_bytes_per_block_match_the_formula(measured, sp):
    tp, results = measured
    formula = costmodel.tp_block_comm(2, CFG.seq_len, CFG.d_model, tp, 4, sequence_parallel=sp)
    for _, _, blocks in results:
        counted = blocks[sp]["comm"]
        for phase in ("forward", "backward"):
            want = {k: (calls, calls * n) for k, (calls, n) in formula[phase].items()}
            assert counted[phase] == want, (phase, counted[phase], want)
            assert blocks[sp]["sent_bytes"][phase] == pytest.approx(
                costmodel.sent_bytes(formula[phase], tp))


def test_sequence_parallel_same_volume_less_activation_memory(measured):
    tp, results = measured
    for _, _, blocks in results:
        plain, sp = blocks[False], blocks[True]
        for phase in ("forward", "backward"):
            assert sp["sent_bytes"][phase] == pytest.approx(plain["sent_bytes"][phase])
        assert sp["activation_bytes"] < plain["activation_bytes"]


@pytest.fixture(scope="module")
def reference():
    return {opt: tpx.train_reference(CFG, STEPS, batch_size=4, optimizer=opt, lr=LR[opt])
            for opt in LR}


STEPS, LR = 4, {"sgd": 0.3, "adamw": 1e-2}


@pytest.mark.parametrize("tp,sp", [(2, False), (4, False), (2, True), (4, True)])
def test_gpt_trains_equal_to_one_process(reference, tp, sp):
    """SGD: loss curve and final parameters within rtol 1e-5 (measured: ~3e-8)."""
    got = tpx.train_tensor_parallel(CFG, tp, STEPS, batch_size=4, sequence_parallel=sp,
                                    optimizer="sgd", lr=LR["sgd"], timeout=120)
    models.assert_same_training(got, reference["sgd"], rtol=RTOL, atol=ATOL)
    assert got.losses[-1] < got.losses[0]


def test_llama_shaped_gpt_trains_equal_to_one_process():
    """Grouped-query attention and SwiGLU, split over 4 ranks with sequence parallelism."""
    expected = tpx.train_reference(LLAMA, STEPS, batch_size=4, optimizer="sgd", lr=LR["sgd"])
    got = tpx.train_tensor_parallel(LLAMA, 4, STEPS, batch_size=4, sequence_parallel=True,
                                    optimizer="sgd", lr=LR["sgd"], timeout=120)
    models.assert_same_training(got, expected, rtol=RTOL, atol=ATOL)
    assert got.losses[-1] < got.losses[0]


def test_gpt_trains_equal_to_one_process_with_adamw(reference):
    """AdamW divides each gradient by its running RMS, so an element whose gradient is
    ~0 moves by up to lr per step on rounding noise alone: losses within rtol 1e-5
    (measured ~1e-7), parameters within atol 2e-4 = lr / 50 (measured ~8e-5)."""
    got = tpx.train_tensor_parallel(CFG, 4, STEPS, batch_size=4, sequence_parallel=True,
                                    optimizer="adamw", lr=LR["adamw"], timeout=120)
    models.assert_same_training(got, reference["adamw"], rtol=RTOL, atol=2e-4)
    with pytest.raises(AssertionError):       # the check can fail: a different seed differs
        models.assert_same_training(
            tpx.train_reference(CFG, STEPS, batch_size=4, seed=1), got, rtol=RTOL, atol=2e-4)


def test_dtensor_gives_the_same_outputs():
    (res, *_) = lecture_lib.run(tpx.compare_with_dtensor, 2, 16, 64, 32, 2, timeout=120)
    for a, b in zip(res["ours"], res["dtensor"]):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    assert res["ours_s"] > 0 and res["dtensor_s"] > 0


# -- bad input: a clear error before any process starts or any collective runs ----------------

@pytest.mark.parametrize("change,message", [
    (dict(n_heads=2, d_model=32), "n_heads=2"),
    (dict(vocab_size=30), "vocab_size=30"),
    (dict(d_ff=34), "d_ff=34"),
    (dict(n_kv_heads=2), "n_kv_heads=2"),
])
def test_bad_config_fails_before_any_process_starts(monkeypatch, change, message):
    def no_launch(*args, **kwargs):
        raise AssertionError("ranks were started")
    monkeypatch.setattr(tp_lib.experiments, "run", no_launch)
    cfg = models.GPTConfig(**{**CFG.__dict__, "n_kv_heads": 0, **change})
    with pytest.raises(ValueError, match=message):
        tpx.train_tensor_parallel(cfg, 4, 1)
    with pytest.raises(ValueError, match="seq_len"):
        tpx.train_tensor_parallel(models.GPTConfig(**{**CFG.__dict__, "seq_len": 6}), 4, 1,
                                  sequence_parallel=True)
    with pytest.raises(ValueError, match="tensor-parallel size"):
        tpx.train_tensor_parallel(CFG, 0, 1)
    with pytest.raises(ValueError, match=message):             # every tp checked first
        tpx.measure_step_scaling(cfg, 4, (1, 4))


def test_measure_step_scaling_gives_rank_0s_step_per_tp():
    out = tpx.measure_step_scaling(CFG, 4, (2,), steps=1, warmup=1, timeout=120)
    assert list(out) == [2] and out[2]["step_s"] > 0 and 0 <= out[2]["comm_share"] <= 1
    assert out[2]["time"] == "real" and out[2]["sent_bytes"] > 0
    links = tpx.measure_links(CFG, 4, (2,), {"nvlink": "h100-node", "ib": "h100-ib"},
                              steps=2, timeout=120)         # the same two steps as above
    nv, ib = links["nvlink"], links["ib"]
    assert nv[2]["time"] == "emulated H100 + NVLink" and ib[2]["time"].endswith("InfiniBand")
    assert ib[2]["comm_share"] > nv[2]["comm_share"] > 0    # virtual time: deterministic
    assert nv[2]["sent_bytes"] == ib[2]["sent_bytes"] == out[2]["sent_bytes"]
    assert len(out[2]["losses"]) == 2
    assert nv[2]["losses"] == ib[2]["losses"] == out[2]["losses"]   # bit for bit


@pytest.mark.parametrize("call,message", [
    (lambda: tpx.measure_step_scaling(CFG, 4, (2,), preset="h200-node"), "unknown emulation"),
    (lambda: tpx.measure_step_scaling(CFG, 4, (2,), preset=3), "a name or an emulate"),
    (lambda: tpx.measure_step_scaling(CFG, 0, (2,), preset="h100-ib"), "batch_size"),
    (lambda: tpx.measure_step_scaling(CFG, 4, ()), "at least one"),
    (lambda: tpx.measure_step_scaling(CFG, 4, (2,), steps=0, preset="h100-ib"), "steps"),
    (lambda: tpx.measure_links(CFG, 4, (2,), {"nv": "h100-node", "x": "nope"}),
     "unknown emulation"),
    (lambda: tpx.measure_links(CFG, 4, (2, 3), {"nv": "h100-node"}), "divisible"),
    (lambda: tpx.measure_links(CFG, 4, (2,), {}), "non-empty"),
    (lambda: tpx.measure_links(CFG, 4, (2,), {"h": "h100-node", "a": "a100-ib"}),
     "one device"),
])
def test_emulated_scaling_rejects_bad_input_before_any_process_starts(monkeypatch, call,
                                                                      message):
    def no_launch(*args, **kwargs):
        raise AssertionError("ranks were started")
    monkeypatch.setattr(tp_lib.experiments, "run", no_launch)
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def _bad_layers():
    errors = []
    for build in (lambda: tp_lib.ColumnParallelLinear(8, 6),
                  lambda: tp_lib.RowParallelLinear(6, 8),
                  lambda: tp_lib.ParallelSelfAttention(models.GPT(
                      models.GPTConfig(d_model=24, n_heads=6, n_layers=1)).blocks[0].attn),
                  lambda: tp_lib.VocabParallelEmbedding(torch.nn.Embedding(10, 4)),
                  lambda: tp_lib.ParallelSelfAttention(models.GPT(models.GPTConfig(
                      d_model=32, n_heads=4, n_kv_heads=2, n_layers=1)).blocks[0].attn)):
        try:
            with record_comm() as counter:
                build()
        except ValueError as exc:
            errors.append((str(exc), counter.calls()))
    return errors


def test_layers_refuse_uneven_splits_before_communicating():
    errors = lecture_lib.run(_bad_layers, 4, timeout=60)[0]
    assert [calls for _, calls in errors] == [0, 0, 0, 0, 0]
    text = " | ".join(e for e, _ in errors)
    for piece in ("out_features=6", "in_features=6", "n_heads=6", "vocab_size=10",
                  "n_kv_heads=2"):
        assert piece in text


def _one_rank_misconfigured():
    out = 8 if dist.get_rank() != 1 else 7            # rank 1 alone is wrong
    layer = tp_lib.ColumnParallelLinear(4, out, gather_output=True)
    return layer(torch.ones(2, 4)).shape


def test_a_failing_rank_ends_the_call_instead_of_hanging():
    with pytest.raises(lecture_lib.RankError) as info:
        lecture_lib.run(_one_rank_misconfigured, 2, timeout=60)
    assert info.value.rank == 1 and "out_features=7" in str(info.value)


def test_vocab_loss_rejects_mismatched_targets():
    with pytest.raises(ValueError, match="must agree"):
        tp_lib.vocab_parallel_cross_entropy(torch.zeros(2, 3, 4),
                                            torch.zeros(2, 4, dtype=torch.long))


def test_cost_model_of_a_layer():
    nv = costmodel.tp_layer_time(4, 2048, 8192, 8, costmodel.NVLINK_H100)
    ib = costmodel.tp_layer_time(4, 2048, 8192, 8, costmodel.INFINIBAND_NDR)
    assert nv["compute"] == ib["compute"] and ib["comm"] > 5 * nv["comm"]
    one = costmodel.tp_layer_time(4, 2048, 8192, 1, costmodel.NVLINK_H100)
    assert one["comm"] == 0 and nv["compute"] == pytest.approx(one["compute"] / 8)
    assert costmodel.tp_block_comm(1, 8, 32, 1) == {"forward": {}, "backward": {}}
    with pytest.raises(ValueError, match="tp must be"):
        costmodel.tp_block_comm(1, 8, 32, 0)


def _train_on_tp_axis(cfg, steps):
    grid = RankGrid(dp=2, tp=2)              # ranks {0, 1} and {2, 3} each hold one model
    return tpx.train_on_rank(cfg, steps, batch_size=4, optimizer="sgd", lr=LR["sgd"],
                             sequence_parallel=True, group=grid.group("tp"))


def test_layers_run_on_the_tp_axis_of_a_rank_grid(reference):
    """group= : two tensor-parallel groups side by side, each equal to one process."""
    results = lecture_lib.run(_train_on_tp_axis, 4, CFG, STEPS, timeout=120)
    for got in results:
        models.assert_same_training(got, reference["sgd"], rtol=RTOL, atol=ATOL)
