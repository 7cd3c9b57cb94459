"""FSDP (lecture_lib.zero.fsdp): the parameters are the shards; equal to one process.

Tolerances, stated once:
* fp32, SGD: losses and parameters within rtol 1e-5, atol 1e-6 (measured: 1e-7 / 1e-8).
* fp32, AdamW: losses within rtol 1e-5; parameters within atol 5e-4 (measured 1.4e-4),
  because the attention key bias has a gradient that is zero in exact arithmetic (softmax
  ignores a shift shared by all keys) and Adam turns its rounding noise into lr-sized steps
  (CONTRIBUTING's AdamW note).
* 16-bit compute against one process running the same casts (fp32 master, weights rounded
  to 16 bits for forward and backward: precision.MixedPrecisionTrainer): the batch is split
  over ranks and the reduce-scatter sums 16-bit gradients, so the two runs round differently.
  Tolerance from lecture_lib.tolerance (the rule, derived from the format and the number of
  16-bit roundings, not from one CPU's kernels): rtol(dtype, gpt_depth(layers, ranks)) for
  the losses and, with SGD, for each parameter's distance to the reference against the
  distance it moved (scale_floor: the attention key bias moves by rounding noise alone).
"""
import pytest
import torch
import torch.nn as nn

import lecture_lib
from lecture_lib import emulate, precision, tolerance, zero
from lecture_lib.metrics import Timer
from lecture_lib.models import GPT, GPTConfig, MarkovText, assert_same_training, train_reference
from lecture_lib.zero import emulated as zemu
from lecture_lib.zero import experiments as zerox
from lecture_lib.zero import fsdp_experiments as fsdpx

CFG = GPTConfig(n_layers=2)
DATA = MarkovText()
STEPS, BATCH = 3, 8


def batches(step):
    return DATA.batch(step, BATCH)


def make_gpt():
    return GPT(CFG)


class TiedOddModel(nn.Module):
    """Tied embedding and head, a frozen layer, and sizes no world size divides."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(CFG.vocab_size, 7)
        self.frozen = nn.Linear(7, 7)
        self.frozen.requires_grad_(False)
        self.mid = nn.Linear(7, 5)
        self.out = nn.Linear(5, 7)
        self.head = nn.Linear(7, CFG.vocab_size, bias=False)
        self.head.weight = self.emb.weight                  # tied

    def forward(self, idx, targets):
        h = self.out(torch.tanh(self.mid(torch.tanh(self.frozen(self.emb(idx))))))
        logits = self.head(h)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           targets.reshape(-1))


class _SGDMaster(precision.MixedPrecisionTrainer):
    """The one-process reference with the same casts, stepping its fp32 master with SGD."""

    def __init__(self, model, dtype, lr):
        super().__init__(model, dtype, lr=lr)
        self.optimizer = torch.optim.SGD(self.master, lr=lr)


def _cast_reference(dtype: str, optimizer: str, lr: float, steps: int):
    trainer = (_SGDMaster(make_gpt(), dtype, lr) if optimizer == "sgd"
               else precision.MixedPrecisionTrainer(make_gpt(), dtype, lr=lr))
    losses = [trainer.step(*batches(s)) for s in range(steps)]
    names = [n for n, _ in make_gpt().named_parameters()]
    return losses, dict(zip(names, (m.detach() for m in trainer.master))), trainer.skipped


# -- bad input, before any process ------------------------------------------------

def test_bad_input_is_refused_before_any_process():
    model = make_gpt()
    for dtype, match in ((torch.int32, "floating-point"), ("bf16", "torch.dtype")):
        with pytest.raises(TypeError, match=match):
            zero.check_fsdp(model, compute_dtype=dtype)
    with pytest.raises(ValueError, match="is not a submodule"):
        zero.check_fsdp(model, units=[nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="must not nest"):
        zero.check_fsdp(model, units=[model.blocks[0], model.blocks[0].attn])
    with pytest.raises(ValueError, match="wrapped module itself"):
        zero.check_fsdp(model, units=[model])
    with pytest.raises(TypeError, match="wraps an nn.Module"):
        zero.check_fsdp("gpt")
    with pytest.raises(TypeError, match="floating-point"):      # the class checks first too
        zero.FullyShardedModel(model, compute_dtype=torch.int64)


def test_default_policy_blocks_linears_embeddings():
    model = make_gpt()
    names = [n for n, _ in zero.resolve_units(model)]
    assert names == ["tok_emb", "pos_emb", "blocks.0", "blocks.1", "head"]
    linears = [n for n, _ in zero.resolve_units(model, lambda m: isinstance(m, nn.Linear))]
    assert linears[0] == "blocks.0.attn.q" and len(linears) == 6 * CFG.n_layers + 1


# -- equal to one process, at 2 and 4 ranks --------------------------------------

def _fp32_and_odd_models():
    out = {opt: zerox.train_fsdp(make_gpt, batches, STEPS, lr, opt)
           for opt, lr in (("sgd", 0.1), ("adamw", 1e-2))}
    out["odd"] = zerox.train_fsdp(TiedOddModel, batches, STEPS, 0.1, "sgd")
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_fp32_equals_one_process(world_size):
    results = lecture_lib.run(_fp32_and_odd_models, world_size, timeout=180)
    sgd = train_reference(make_gpt(), batches, STEPS, 0.1, "sgd")
    adamw = train_reference(make_gpt(), batches, STEPS, 1e-2, "adamw")
    odd = train_reference(TiedOddModel(), batches, STEPS, 0.1, "sgd")
    frozen = TiedOddModel().frozen.weight
    for rank, r in enumerate(results):
        assert_same_training(r["sgd"]["result"], sgd, rtol=1e-5, atol=1e-6)
        assert_same_training(r["adamw"]["result"], adamw, rtol=1e-5, atol=5e-4)
        # uneven sizes (7, 5, 35 elements), a tied pair, a frozen layer: still equal
        assert_same_training(r["odd"]["result"], odd, rtol=1e-5, atol=1e-6)
        assert torch.equal(r["odd"]["result"].params["frozen.weight"], frozen), rank
        assert "head.weight" not in r["odd"]["result"].params       # one tensor, one name


def _casts():
    out = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for opt, lr in (("sgd", 0.1), ("adamw", 1e-2)):
            out[name, opt] = zerox.train_fsdp(make_gpt, batches, 4, lr, opt, compute_dtype=dtype)
    return out


# the 4-rank case (the deeper reduction) is rerun on the older oneDNN kernels (sixteen_bit)
@pytest.mark.parametrize("world_size", [2, pytest.param(4, marks=pytest.mark.sixteen_bit)])
def test_compute_dtype_equals_one_process_with_the_same_casts(world_size):
    results = lecture_lib.run(_casts, world_size, timeout=180)
    init = dict(make_gpt().named_parameters())
    for (name, opt), got in results[0].items():
        ref_losses, ref_params, skipped = _cast_reference(name, opt, 0.1 if opt == "sgd"
                                                          else 1e-2, 4)
        dtype = torch.bfloat16 if name == "bf16" else torch.float16
        rtol = tolerance.rtol(dtype, tolerance.gpt_depth(CFG.n_layers, world_size))
        for a, b in zip(got["result"].losses, ref_losses):
            assert abs(a - b) <= rtol * abs(b), (name, opt, got["result"].losses, ref_losses)
        assert got["skipped"] == skipped            # fp16: the same overflow skipped (step 1)
        if opt == "sgd":
            moved = {n: ref - init[n] for n, ref in ref_params.items()}
            scale = tolerance.scale_floor(moved)
            for n, ref in ref_params.items():
                off = (got["result"].params[n] - ref).norm()
                assert off <= rtol * scale[n], (name, n, float(off), scale[n], rtol)


# -- the parameters are the shards; any optimizer; CS336's helpers; checkpoints ---

def _shards_and_checkpoint(folder):
    model = zero.get_fsdp(make_gpt(), torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)          # built the usual way
    x, y = batches(0)
    model(x, y).backward()
    zero.fsdp_on_after_backward(model, opt)
    grads = [(tuple(p.shape), p.dtype, tuple(p.grad.shape), p.grad.dtype)
             for p in model.module.parameters()]
    opt.step()
    full = zero.fsdp_gather_full_params(model)
    zero.save_sharded(model, opt, folder)
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    model(x, y).backward()
    opt.step()
    moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    zero.load_sharded(model, opt, folder)
    back = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return {"grads": grads, "full": {k: tuple(v.shape) for k, v in full.items()},
            "moved": moved, "back": back, "state": len(opt.state)}


def test_parameters_are_fp32_shards_and_checkpoints_load_back(tmp_path):
    results = lecture_lib.run(_shards_and_checkpoint, 2, str(tmp_path), timeout=120)
    ref = make_gpt()
    for r in results:
        for (shape, dtype, gshape, gdtype), (name, p) in zip(r["grads"], ref.named_parameters()):
            expected = p.shape if name.startswith("ln_f") else ((p.numel() + 1) // 2,)
            assert shape == gshape == tuple(expected), name
            assert dtype == gdtype == torch.float32, name             # fp32 master and grad
        assert r["full"] == {n: tuple(p.shape) for n, p in ref.named_parameters()}
        assert r["moved"] and r["back"] and r["state"] == len(list(ref.parameters()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.pt", "rank1.pt"]


# -- bytes on the wire, memory, prefetch ----------------------------------------

@pytest.mark.parametrize("world_size", [2, 4])
def test_bytes_sent_3_psi_against_2_psi(world_size):
    got = lecture_lib.run(fsdpx.measure_comm_volume, world_size, make_gpt, batches,
                          timeout=120)[0]
    # Rajbhandari et al. 2020, section 7. FSDP is a little under 3 Psi because the final
    # LayerNorm (128 of 110k parameters) is replicated and all-reduced: 2x, not 3x.
    assert got["zero2"]["psi"] == pytest.approx(2.0, abs=1e-9)
    assert got["fsdp"]["psi"] == pytest.approx(3.0, abs=2e-3)
    assert got["fsdp_keep"]["psi"] == pytest.approx(2.0, abs=1e-9)  # no backward all-gather
    assert got["fsdp_bf16"]["psi"] == pytest.approx(got["fsdp"]["psi"] / 2, abs=2e-3)
    # ZeRO-1 reduce-scatters the gradients and all-gathers the parameters: 1 + 1, as the
    # paper's P_os and as plain data parallelism's all-reduce
    assert got["zero1"]["psi"] == pytest.approx(2.0, abs=1e-9)


def test_reshard_after_forward_trades_memory_for_an_all_gather():
    got = lecture_lib.run(fsdpx.measure_fsdp_memory, 2, make_gpt, batches, timeout=60)[0]
    every_unit = 4 * sum(p.numel() for n, p in make_gpt().named_parameters()
                         if not n.startswith("ln_f"))
    assert got[False]["peak_gathered_bytes"] == every_unit       # kept from forward to backward
    assert got[True]["peak_gathered_bytes"] < every_unit / 2      # at most a unit and the next
    assert got[True]["gathers"] == 2 * got[False]["gathers"]
    assert got[True]["sent"] > 1.4 * got[False]["sent"]


def _timelines():
    return {pf: fsdpx.fsdp_timeline(make_gpt, batches, 2, pf, Timer()) for pf in (True, False)}


def test_prefetch_overlaps_the_next_gather_with_compute():
    for r in lecture_lib.run(_timelines, 2, timeout=60):
        on, off = r[True], r[False]
        assert on["overlapped"] > 0 and off["overlapped"] == 0
        # with prefetch, block k+1's all-gather is launched before block k's forward is done
        order = [e[:2] for e in on["events"]]
        assert order.index(("gather", "blocks.1")) < order.index(("done", "blocks.0"))
        order = [e[:2] for e in off["events"]]
        assert order.index(("gather", "blocks.1")) > order.index(("done", "blocks.0"))
        assert len(on["step_seconds"]) == 2 and all(s > 0 for s in on["step_seconds"])


# -- side by side with torch FSDP2 ------------------------------------------------

def _with_fsdp2():
    return {dtype: zerox.fsdp2_side_by_side(make_gpt, batches, STEPS, compute_dtype=dtype)
            for dtype in (None, torch.bfloat16)}


@pytest.mark.sixteen_bit
def test_side_by_side_with_fsdp2_fp32_and_bf16():
    ref = train_reference(make_gpt(), batches, STEPS)
    for r in lecture_lib.run(_with_fsdp2, 2, timeout=180):
        bf16 = tolerance.rtol(torch.bfloat16, tolerance.gpt_depth(CFG.n_layers, 2))
        for dtype, tol in ((None, 1e-5), (torch.bfloat16, bf16)):
            ours, theirs = r[dtype]["ours"], r[dtype]["fsdp2"]
            for a, b in zip(ours["result"].losses, theirs["result"].losses):
                assert abs(a - b) <= tol * abs(b), (dtype, a, b)
            for kind in ("params", "grads", "optimizer"):
                assert ours["held"][kind] == pytest.approx(theirs["held"][kind], rel=0.01), kind
        assert_same_training(r[None]["fsdp2"]["result"], ref, rtol=1e-5, atol=5e-4)


# -- prefetching in emulated time ----------------------------------------------------

# Prefetching pays only when the GPU would wait for an all-gather. Under the calibrated charges
# a small model is launch-bound in eager mode: the host spends 5 us launching each operation,
# longer than the kernel runs, so the GPU waits for the host, and a gather's wait is absorbed by
# the host's lag (at d_model 128 on an H100 node the step is the same with and without
# prefetch). Here the gathers are longer than the host's work: d_model 512 (a block's 3.1M
# fp32 parameters, 12.6 MB per gather) over InfiniBand HDR (one A100 per node), 4 sequences
# of 64 tokens per rank (cheap on the CPU): the step is communication-bound and prefetching
# hides a gather behind compute.
EMU_PRESET = "a100-ib"
EMU_CFG = GPTConfig(n_layers=2, d_model=512, seq_len=64)
EMU_DATA = MarkovText(seq_len=64)


def emu_batches(step):
    return EMU_DATA.batch(step, 8)


def make_emu_gpt():
    return GPT(EMU_CFG)


def _emulated_timelines():
    make = make_emu_gpt
    out = {pf: fsdpx.fsdp_timeline_emulated(make, emu_batches, 2, pf, EMU_PRESET)
           for pf in (True, False)}
    out["again"] = fsdpx.fsdp_timeline_emulated(make, emu_batches, 2, True, EMU_PRESET)
    out["real"] = fsdpx.fsdp_timeline(make, emu_batches, 2, True, Timer())
    return out


def test_prefetch_shortens_the_emulated_step():
    for r in lecture_lib.run(_emulated_timelines, 2, timeout=300):
        on, off = r[True], r[False]
        assert on["time_kind"] == off["time_kind"] == "emulated A100 + InfiniBand"
        # emulated time depends only on the program: a second run reads the same clock
        assert r["again"]["step_seconds"] == on["step_seconds"]
        assert r["again"]["spans"] == on["spans"]
        # prefetch hides part of the all-gathers behind compute and the step gets shorter;
        # without it no all-gather is hidden (the reduce-scatters may be, either way)
        assert on["hidden_gathers"] > 0 and off["hidden_gathers"] == 0
        assert on["hidden"] > off["hidden"] >= off["hidden_gathers"]
        assert on["overlapped"] > 0 and off["overlapped"] == 0
        assert on["blocked"] < off["blocked"]
        assert on["step_seconds"][-1] < 0.9 * off["step_seconds"][-1]
        # the same collectives either way (their time on the wire is the same)
        wire = {pf: sum(b - a for _, a, b in r[pf]["wire"]) for pf in (True, False)}
        assert [k for k, *_ in on["wire"]].count("all_gather") > 0
        assert sorted(k for k, *_ in on["wire"]) == sorted(k for k, *_ in off["wire"])
        assert "reduce_scatter" in {k for k, *_ in on["wire"]}
        assert wire[True] == pytest.approx(wire[False], rel=1e-9)
        # one definition of hidden, over every collective: the step's two streams span it,
        # step = compute + communication - hidden = compute + waiting
        for x in (on, off):
            step = x["step_seconds"][-1]
            compute = sum(b - a for a, b in x["compute"])
            waiting = sum(b - a for a, b in x["idle"])
            assert x["compute"][0][0] <= 1e-9 * step and x["compute"][-1][1] >= (1 - 1e-9) * step
            comm = sum(b - a for _, a, b in x["wire"])
            assert step == pytest.approx(compute + comm - x["hidden"], rel=1e-6)
            assert step == pytest.approx(compute + waiting, rel=1e-6)
            assert 0 <= x["hidden_gathers"] <= x["hidden"]
        # only timed, not changed: bit-identical losses with and without the emulation
        assert on["losses"] == off["losses"] == r["real"]["losses"]


# -- the dry run reads the real run's clock; FSDP at real size ------------------------

SMALL = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_heads=4, n_layers=2)
FSDP_CASES = ["fsdp", "fsdp_no_prefetch", "fsdp_keep", "fsdp_keep_no_prefetch", "fsdp_bf16"]


def _real_and_dry(case):
    out = {}
    for dry_run in (False, True):
        with emulate.emulated("h100-node", dry_run=dry_run) as clock:
            split = zemu.zero_steps(case, SMALL, 2, steps=2)
        out[dry_run] = ({**clock.summary(), "issued": list(clock.issued)}, split)
    return out


@pytest.mark.parametrize("case", FSDP_CASES)
def test_dry_run_reads_the_real_runs_clock(case):
    # prefetch on or off, resharding after forward or not, bf16 compute: the dry run (fake
    # tensors) charges the same operations and collectives at the same times
    for rank in lecture_lib.run(_real_and_dry, 2, case, timeout=120):
        (real, real_split), (dry, dry_split) = rank[False], rank[True]
        assert real["now"] > 0 and real["bytes_by_kind"]["all_gather"] > 0
        assert dry == real                    # now, totals, bytes, spans, issue times
        assert dry_split == real_split        # the split, streams, bytes held, peak gathered


def test_checkpointing_with_fsdp_is_refused():
    with pytest.raises(ValueError, match="activation checkpointing with this FSDP"):
        with emulate.emulated("h100-node", dry_run=True):
            zemu.zero_steps("fsdp", SMALL, 1, checkpointing=True)


def test_prefetch_hides_the_all_gathers_at_real_size():
    # a Llama 3 8B shape (4 of its 32 layers), one 8192-token sequence per rank, 2 ranks, in
    # the dry run: prefetching hides most of the all-gathers behind compute and shortens the
    # step; keeping the full weights from forward to backward sends a third less and holds more
    out = zemu.time_at_scale("Llama 3 8B", ("fsdp", "fsdp_no_prefetch", "fsdp_keep"),
                             world_size=2, batch_per_rank=1, steps=1, n_layers=4, timeout=180)
    on, off, keep = (out["cases"][c] for c in ("fsdp", "fsdp_no_prefetch", "fsdp_keep"))
    assert on["bytes"] == off["bytes"] and on["comm"] == pytest.approx(off["comm"], rel=1e-9)
    assert on["exposed_by_kind"]["all_gather"] < 0.5 * off["exposed_by_kind"]["all_gather"]
    assert on["step"] < 0.95 * off["step"]
    assert keep["bytes"]["all_gather"] == on["bytes"]["all_gather"] / 2
    assert keep["peak_gathered_bytes"] > 2 * on["peak_gathered_bytes"]
    assert keep["step"] < on["step"]
    # every block's all-gather is in flight while another unit computes
    flying = {unit for kind, unit, *_ in on["unit_spans"] if kind == "in flight"}
    assert {f"blocks.{i}" for i in range(4)} <= flying
