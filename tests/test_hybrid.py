"""3-D parallelism equals one process; bad grids fail before any process starts; the dry run
times its step exactly as the emulated real run does, and runs real sizes."""
import inspect

import pytest
import torch.distributed as dist

import lecture_lib
from lecture_lib.costmodel import bus_factor
from lecture_lib.data_parallel import DDPBucketed
from lecture_lib.dims import ParallelDims, Recipe
from lecture_lib.hybrid import check_hybrid, parallelize, time_at_scale, train_hybrid
from lecture_lib.hybrid.experiments import same_clock_real_and_dry
from lecture_lib.mesh import RankGrid
from lecture_lib.models import (
    GPT,
    GPTConfig,
    MarkovText,
    assert_same_training,
    real_size,
    shard,
    train_reference,
)

CFG = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=4, n_layers=4)
BATCH, STEPS = 8, 3


def _reference(optimizer, lr):
    data = MarkovText(CFG.vocab_size, CFG.seq_len)
    return train_reference(GPT(CFG, 0), lambda s: data.batch(s, BATCH), STEPS, lr, optimizer)


GRIDS = [(2, 2, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2)]


@pytest.mark.parametrize("dims", GRIDS, ids=lambda d: "dp%d-tp%d-pp%d" % d)
@pytest.mark.parametrize("zero_stage", [0, 1], ids=["adamw", "zero1"])
def test_equal_to_one_process(dims, zero_stage):
    dp, tp, pp = dims
    par, recipe = ParallelDims(dp=dp, tp=tp, pp=pp), Recipe(microbatches=2, zero_stage=zero_stage)
    # SGD: updates are proportional to gradients, so rtol 1e-4 holds for every parameter.
    got, results = train_hybrid(CFG, par, recipe, BATCH, STEPS, lr=0.1, optimizer="sgd",
                                timeout=180)
    assert_same_training(got, _reference("sgd", 0.1), rtol=1e-4, atol=1e-6)
    # AdamW: losses within rtol 1e-4; parameters within atol 1e-4, because the key bias has a
    # gradient that is zero in exact arithmetic (softmax ignores a shift shared by all keys),
    # and Adam turns the ~1e-9 rounding noise there into steps of size lr.
    got, _ = train_hybrid(CFG, par, recipe, BATCH, STEPS, lr=1e-2, timeout=180)
    assert_same_training(got, _reference("adamw", 1e-2), rtol=1e-4, atol=1e-4)
    _step_is_its_timed_phases(results, zero_stage)


def _step_is_its_timed_phases(results, zero_stage):
    """Every rank timed exactly the phases of a step without cp, each a positive time; ZeRO-1
    has no dp sync of its own (its optimizer reduce-scatters the gradients).

    No ordering between phases is asserted: one run's real times on a shared 2-core
    machine can put a preempted optimizer step above the forward and backward passes
    (a CI run measured 13.48 ms against 13.19 ms)."""
    phases = {"pipeline", "optimizer"} | ({"dp sync"} if zero_stage == 0 else set())
    for r in results:
        assert set(r["step_seconds"]) == phases          # no cp: no cp sync phase
        assert all(v > 0 for v in r["step_seconds"].values())


def _bucketed_dp_on_rank(microbatches):
    """ZeRO-0's dp sync: the buckets go out during the last micro-batch's backward, so by
    the time the step waits for them (finish_gradient_synchronization) all are in flight."""
    dims, recipe = ParallelDims(dp=2), Recipe(microbatches=microbatches)
    rank = parallelize(GPT(CFG, 0), dims, recipe, RankGrid.from_dims(dims), "sgd", 0.1)
    ddp, in_flight = rank.ddp, []
    finish = ddp.finish_gradient_synchronization
    ddp.finish_gradient_synchronization = lambda: (in_flight.append(len(ddp._launched)), finish())
    x, y = shard(MarkovText(CFG.vocab_size, CFG.seq_len).batch(0, BATCH), dist.get_rank(), 2)
    rank.step(x, y)
    return {"bucketed": isinstance(ddp, DDPBucketed), "accumulation": ddp.accumulation,
            "buckets": len(ddp.buckets), "in_flight": in_flight}


@pytest.mark.parametrize("microbatches", [1, 2])
def test_data_parallel_axis_reduces_in_buckets_during_backward(microbatches):
    for r in lecture_lib.run(_bucketed_dp_on_rank, 2, microbatches, timeout=120):
        assert r["bucketed"] and r["accumulation"] == microbatches
        assert r["in_flight"] == [r["buckets"]]          # every bucket launched before the wait


@pytest.mark.parametrize("par, recipe, batch, match", [
    (ParallelDims(dp=2, tp=3), Recipe(), 8, "not divisible by tensor-parallel size 3"),
    (ParallelDims(pp=3), Recipe(), 8, "do not split evenly into 3 stages"),
    (ParallelDims(dp=3), Recipe(), 8, "does not split over dp=3"),
    (ParallelDims(pp=2), Recipe(microbatches=3), 8, "does not divide into 3"),
])
def test_bad_configurations(par, recipe, batch, match):
    with pytest.raises(ValueError, match=match):
        check_hybrid(CFG, par, recipe, batch)


def test_grid_must_match_world_size():
    with pytest.raises(ValueError, match="has 4 ranks but world_size is 8"):
        check_hybrid(CFG, ParallelDims(dp=2, tp=2), Recipe(), 8, world_size=8)


CP_GRIDS = [(ParallelDims(dp=2, cp=2), Recipe(microbatches=2)),
            (ParallelDims(dp=2, tp=2, cp=2), Recipe(microbatches=2)),
            (ParallelDims(pp=2, cp=2), Recipe(microbatches=2, cp_layout="contiguous")),
            (ParallelDims(tp=2, cp=2), Recipe(cp_method="ulysses", cp_layout="contiguous"))]


@pytest.mark.parametrize("par, recipe", CP_GRIDS, ids=["dp2-cp2", "dp2-tp2-cp2",
                                                         "pp2-cp2-contiguous", "tp2-cp2-ulysses"])
def test_context_parallel_axis_equals_one_process(par, recipe):
    # SGD: rtol 1e-4 as above; the cp gradients are averaged over the cp group, then over dp
    got, results = train_hybrid(CFG, par, recipe, BATCH, STEPS, lr=0.1, optimizer="sgd",
                                timeout=180)
    assert_same_training(got, _reference("sgd", 0.1), rtol=1e-4, atol=1e-6)
    assert {r["coords"]["cp"] for r in results} == {0, 1}


def test_context_parallel_with_zero1_and_adamw():
    got, _ = train_hybrid(CFG, ParallelDims(dp=2, cp=2), Recipe(zero_stage=1), BATCH, STEPS,
                          lr=1e-2, timeout=180)
    assert_same_training(got, _reference("adamw", 1e-2), rtol=1e-4, atol=1e-4)  # as above


@pytest.mark.parametrize("par, recipe, seq_len, match", [
    (ParallelDims(cp=3), Recipe(), 16, "not divisible by 6"),
    (ParallelDims(cp=4), Recipe(cp_layout="zigzag"), 12, "not divisible by 8"),
    (ParallelDims(tp=2, cp=4), Recipe(cp_method="ulysses", cp_layout="contiguous"), 16,
     "heads divisible by cp"),
])
def test_bad_context_parallel_configurations(par, recipe, seq_len, match):
    cfg = GPTConfig(vocab_size=32, seq_len=seq_len, d_model=32, n_heads=4, n_layers=4)
    with pytest.raises(ValueError, match=match):
        check_hybrid(cfg, par, recipe, 8)


def test_zero1_sends_what_data_parallelism_sends():
    """ZeRO-1 reduce-scatters the local gradients and all-gathers the updated shards: the
    bytes of DDP's one all-reduce (a ring all-reduce is those two), and no all-reduce over dp."""
    cfg = real_size("GPT-2 small", n_layers=2)
    layouts = {f"zero{z}": (ParallelDims(dp=2), Recipe(zero_stage=z)) for z in (0, 1)}
    ddp, zero1 = (row["bytes"] for row in time_at_scale(layouts, cfg, 4))
    assert set(ddp) == {"all_reduce"} and set(zero1) == {"reduce_scatter", "all_gather"}
    sent = {name: sum(b * bus_factor(k, 2) for k, b in kinds.items())    # on the wire, per ring
            for name, kinds in (("ddp", ddp), ("zero1", zero1))}
    assert sent["zero1"] == pytest.approx(sent["ddp"], rel=1e-3)


def _tp_shapes():
    from lecture_lib.mesh import RankGrid  # noqa: PLC0415  (imported on the rank)
    dims = ParallelDims(tp=2)
    rank = lecture_lib.hybrid.parallelize(GPT(CFG, 0), dims, Recipe(), RankGrid.from_dims(dims))
    return {name: tuple(p.shape) for name, p in rank.module.named_parameters()}


def test_tensor_parallel_splits_the_vocabulary():
    """Notebook 04's Megatron split, whole: the token embedding's rows and the head's output
    columns are split over tp like the blocks (the loss is vocabulary-parallel)."""
    from lecture_lib.runtime import launch  # noqa: PLC0415
    for shapes in launch.run(_tp_shapes, 2, timeout=120):
        assert shapes["0.tok_emb.weight"] == (CFG.vocab_size // 2, CFG.d_model)
        assert shapes["0.head.weight"] == (CFG.vocab_size // 2, CFG.d_model)
        assert shapes["0.pos_emb.weight"] == (CFG.seq_len, CFG.d_model)     # replicated


def test_tensor_parallel_splits_the_heads_compute():
    """GPT-2 small with 2 blocks, where the head is most of the matrix work: a tp = 2 rank
    multiplies half of every matrix for the whole batch, a dp = 2 rank all of it for half
    the batch, the same FLOPs; the tp rank also updates half the parameters, so it computes
    less, by about the optimizer's difference. With the head kept whole on every tp rank (its
    work doubled) it computed more (6.0 against 5.3 ms when this test was written)."""
    cfg = real_size("GPT-2 small", n_layers=2)
    layouts = {"dp": (ParallelDims(dp=2), Recipe()), "tp": (ParallelDims(tp=2), Recipe())}
    dp, tp = time_at_scale(layouts, cfg, 4)
    assert tp["compute"] < dp["compute"]
    # the compute by operation: every kernel's seconds (launch waits left out, none here);
    # the tp rank steps half the parameters (the position table and layer norms whole)
    for row in (dp, tp):
        assert sum(row["compute_by_op"].values()) == pytest.approx(row["compute"], rel=0.01)
    optimizer = tp["compute_by_op"]["optimizer step"] / dp["compute_by_op"]["optimizer step"]
    assert 0.5 < optimizer < 0.52
    assert dp["compute"] - tp["compute"] == pytest.approx(
        dp["compute_by_op"]["optimizer step"] - tp["compute_by_op"]["optimizer step"], rel=0.25)


def test_hybrid_uses_the_models_optimizers():
    import lecture_lib.hybrid as hybrid  # noqa: PLC0415  (the module, to look for a removed name)
    assert not hasattr(hybrid, "OPTIMIZERS")
    assert "torch.zeros(1" not in inspect.getsource(hybrid.gpt)          # no dummy optimizer
    with pytest.raises(ValueError, match="optimizer must be"):
        train_hybrid(CFG, ParallelDims(dp=2), Recipe(), BATCH, STEPS, optimizer="lion")


@pytest.mark.parametrize("zero_stage", [2, 3], ids=["zero2", "fsdp"])
def test_sharded_stages_equal_one_process(zero_stage):
    recipe = Recipe(microbatches=2, zero_stage=zero_stage)
    got, results = train_hybrid(CFG, ParallelDims(dp=2), recipe, BATCH, STEPS, lr=0.1,
                                optimizer="sgd", timeout=180)
    assert_same_training(got, _reference("sgd", 0.1), rtol=1e-4, atol=1e-6)
    assert all(set(r["step_seconds"]) == {"forward-backward", "optimizer"} for r in results)


@pytest.mark.parametrize("par, recipe, match", [
    (ParallelDims(dp=2, tp=2), Recipe(zero_stage=3), "tp, pp and cp must be 1"),
    (ParallelDims(dp=2, ep=2), Recipe(), "no experts"),
])
def test_layouts_hybrid_cannot_run(par, recipe, match):
    with pytest.raises(ValueError, match=match):
        check_hybrid(CFG, par, recipe, BATCH)


# ----------------------------------------------------------------------------
# The dry run: the same step on fake tensors reads the same clock, and runs real sizes
# ----------------------------------------------------------------------------

SAME_CLOCK = {    # every path of the trainer's step: pipeline or not, each ZeRO stage, cp
    "dp2 tp2 (all-reduce, Megatron blocks)": (ParallelDims(dp=2, tp=2), Recipe()),
    "dp2 pp2 zero1 (1F1B, sharded step)": (ParallelDims(dp=2, pp=2),
                                           Recipe(microbatches=2, zero_stage=1)),
    "dp2 zero2 (reduce-scatter in backward)": (ParallelDims(dp=2), Recipe(zero_stage=2)),
    "dp2 zero3 (FSDP)": (ParallelDims(dp=2), Recipe(microbatches=2, zero_stage=3)),
    "dp2 cp2 (ring attention)": (ParallelDims(dp=2, cp=2), Recipe()),
}
@pytest.mark.parametrize("name", SAME_CLOCK)
def test_the_dry_run_reads_the_emulated_real_runs_clock_exactly(name):
    dims, recipe = SAME_CLOCK[name]
    for rank in lecture_lib.run(same_clock_real_and_dry, dims.world_size, CFG, dims, recipe,
                                BATCH, timeout=180):
        real, dry = rank[False], rank[True]
        assert real["now"] > 0 and real["comm_bytes"] > 0
        assert dry == real                   # now, totals, bytes, spans, issue times


def test_time_at_scale_runs_a_real_size_model_dry():
    """Two of GPT-2 medium's 24 layers, 8 x 1024 tokens, dp2 x tp2 on emulated H100s: nothing
    computed, every collective charged; tp's activations all-reduced, dp's gradients too."""
    cfg = real_size("GPT-2 medium", n_layers=2)
    row, = time_at_scale({"dp2 tp2": (ParallelDims(dp=2, tp=2), Recipe())}, cfg, 8)
    assert 1e-4 < row["step_seconds"] < 1.0 and 0 < row["mfu"] < 1
    assert row["compute"] < row["step_seconds"] and row["exposed"] > 0
    assert row["bytes"]["all_reduce"] > 0 and row["time_kind"].endswith("(dry run)")
    assert row["spans"] and row["wall_seconds"] < 60


def test_time_at_scale_rejects_an_unknown_precision_before_any_rank_starts():
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        time_at_scale({"tp2": (ParallelDims(tp=2), Recipe())}, CFG, BATCH, precision="fp16")


def test_bf16_autocast_sends_the_activations_of_a_mixed_precision_run():
    """Under bf16 autocast tp's forward all-reduces carry the matmuls' bf16 outputs, so the
    step sends fewer bytes than in fp32, and no fewer than half; the compute is charged alike."""
    cfg = real_size("GPT-2 medium", n_layers=2)
    layouts = {"tp2": (ParallelDims(tp=2), Recipe())}
    fp32, = time_at_scale(layouts, cfg, 4)
    bf16, = time_at_scale(layouts, cfg, 4, precision="bf16")
    sent = {k: r["bytes"]["all_reduce"] for k, r in (("fp32", fp32), ("bf16", bf16))}
    assert sent["fp32"] / 2 <= sent["bf16"] < sent["fp32"]
    assert bf16["comm"] < fp32["comm"]
