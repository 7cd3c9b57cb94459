"""The step-time model, the planner, and the GPT-3 175B example."""
from dataclasses import replace

import pytest

from lecture_lib.calibration import shape_of
from lecture_lib.costmodel import PRESETS, TransformerShape, pipeline_bubble, traffic
from lecture_lib.costmodel.comm import Link, collective_time
from lecture_lib.costmodel.planner import explain, plan, rank_of
from lecture_lib.costmodel.search_space import candidates
from lecture_lib.costmodel.steptime import (
    A100_CLUSTER,
    Cluster,
    Parallelism,
    grad_sync_bytes,
    grad_sync_seconds,
    group_link,
    microbatches,
    step_time,
    training_flops,
)
from lecture_lib.dims import ParallelDims, Recipe
from lecture_lib.models import GPT, GPTConfig

GPT3 = PRESETS["GPT-3 175B"]
LECTURE = Parallelism(ParallelDims(dp=8, tp=8, pp=16), Recipe(microbatch_size=1, zero_stage=1),
                      recompute="full")


def test_placement_decides_the_link():
    c = A100_CLUSTER
    assert group_link(LECTURE, "tp", c) is c.intra            # tp innermost: 8 ranks, one node
    assert group_link(LECTURE, "pp", c) is c.inter
    assert group_link(LECTURE, "dp", c) is c.inter
    dp_inner = Parallelism(ParallelDims(dp=8, tp=8, pp=16), Recipe(microbatch_size=1), inner="dp")
    assert group_link(dp_inner, "dp", c) is c.intra and group_link(dp_inner, "tp", c) is c.inter
    assert group_link(Parallelism(ParallelDims(dp=1, tp=8)), "dp", c) is None


def test_gpt3_lecture_configuration():
    t = step_time(GPT3, LECTURE, A100_CLUSTER, global_batch=1536)
    assert t.microbatches == 1536 // 8
    # compute: (6N + 12 L h s) FLOPs per token x 4/3 (full recomputation), at 50% of 312 TFLOP/s;
    # N: 175B less the position table (the token table is the tied head)
    tokens = 1536 * 2048
    flops = (6 * (175e9 - 2048 * 12288) + 12 * 96 * 12288 * 2048) * tokens * 4 / 3
    assert t.compute == pytest.approx(flops / 1024 / (0.5 * 312e12))
    assert t.bubble == pytest.approx(t.compute * 15 / 192)    # (p - 1) / m of the compute
    assert t.bubble / (t.compute + t.bubble) == pytest.approx(pipeline_bubble(16, 192))
    # Narayanan et al. 2021 (section 5.1): 140 TFLOP/s per GPU on 1024 A100s, batch 1536
    assert 25 < t.total < 45
    assert t.tp_comm > t.pp_comm and t.tp_comm > t.dp_comm


def test_tensor_parallel_across_nodes_is_much_slower():
    inside = step_time(GPT3, LECTURE, A100_CLUSTER, 1536)
    across = step_time(GPT3, replace(LECTURE, inner="dp"), A100_CLUSTER, 1536)
    assert across.tp_comm > 5 * inside.tp_comm


def test_more_devices_less_compute_per_device():
    one_by_one = Recipe(microbatch_size=1)
    one = step_time(GPT3, Parallelism(ParallelDims(dp=1, tp=8, pp=16), one_by_one),
                    A100_CLUSTER, 1536)
    eight = step_time(GPT3, Parallelism(ParallelDims(dp=8, tp=8, pp=16), one_by_one),
                      A100_CLUSTER, 1536)
    assert one.compute == pytest.approx(8 * eight.compute)


def test_training_flops_per_token():
    # N: every weight but the embedding tables a token only looks up. GPT-3's token table is
    # its head (tied), so only the position table (2048 x 12288) drops out
    n = 175e9 - 2048 * 12288
    assert training_flops(GPT3, 1) == pytest.approx(6 * n + 12 * 96 * 12288 * 2048)


def test_training_flops_leave_out_the_looked_up_tables_of_an_exact_model():
    cfg = GPTConfig(vocab_size=96, seq_len=16, d_model=32, n_heads=2, n_layers=2)
    model = GPT(cfg)                                    # untied head, learned positions
    n = sum(p.numel() for p in model.parameters()) - (96 + 16) * 32
    assert training_flops(shape_of(cfg), 1) == pytest.approx(6 * n + 12 * 2 * 16 * 32)
    with pytest.raises(ValueError, match="embedding_params"):
        TransformerShape("x", 2, 32, 2, 96, 16, num_params=1000, embedding_params=1000)


def test_planner_ranks_what_fits_and_finds_the_lecture_config():
    plans = plan(GPT3, A100_CLUSTER, 1536)
    assert plans and all(p.memory["total"] <= 80e9 for p in plans)
    assert [p.seconds for p in plans] == sorted(p.seconds for p in plans)
    position = rank_of(plans, LECTURE)
    assert position is not None and position > 1
    assert plans[0].seconds <= plans[position - 1].seconds
    text = explain(plans[0], plans)
    assert text.startswith("Best: ") and "s per step" in text
    # pure data parallelism cannot hold 175B parameters in 80 GB, whatever the ZeRO stage
    assert all(not (p.parallelism.dims.tp == 1 and p.parallelism.dims.pp == 1) for p in plans)


def test_candidates_respect_divisibility():
    for par in candidates(GPT3, 64, 512):
        d = par.dims
        assert par.devices == 64 and 96 % d.pp == 0 and 96 % d.tp == 0
        assert 512 % (d.dp * par.recipe.microbatch_size) == 0


def test_bad_input():
    with pytest.raises(ValueError, match="not a whole number of micro-batches"):
        microbatches(100, Parallelism(ParallelDims(dp=8), Recipe(microbatch_size=1)))
    with pytest.raises(ValueError, match="no configuration"):
        plan(GPT3, Cluster("tiny", 1, 8, 1e15, 16e9, Link("a", 1e-6, 1e11),
                           Link("b", 1e-5, 1e10)), 1536)
    with pytest.raises(ValueError, match="global batch"):
        plan(GPT3, A100_CLUSTER, 0)
    with pytest.raises(ValueError, match="does not divide"):
        step_time(GPT3, Parallelism(ParallelDims(pp=5)), A100_CLUSTER, 1536)
    with pytest.raises(ValueError, match="inner"):
        Parallelism(ParallelDims(), inner="ep")
    with pytest.raises(ValueError, match="dp"):
        Parallelism(ParallelDims(dp=0))


def test_memory_bound_work_counts_only_where_the_cluster_states_a_bandwidth():
    plain = step_time(GPT3, LECTURE, A100_CLUSTER, 1536)
    assert plain.memory == 0 and "memory-bound ops" not in plain.parts()
    hbm = replace(A100_CLUSTER, memory_bandwidth=2.039e12)
    t = step_time(GPT3, LECTURE, hbm, 1536, optimizer="sgd")
    parts = t.details["memory-bound"]
    tokens, per_device = 1536 * 2048, GPT3.num_params / (8 * 16)
    assert parts["optimizer"] == pytest.approx(3 * per_device * 2 / 2.039e12)
    assert parts["gradient buffer"] == pytest.approx(6 * per_device * 2 / 2.039e12)
    assert parts["element-wise"] == pytest.approx(
        traffic.layer_values(8) * GPT3.hidden * tokens / 8 * (96 // 16) * 2 / 2.039e12)
    assert t.memory == pytest.approx(sum(parts.values())) and t.parts()["memory-bound ops"]
    assert t.compute == plain.compute and t.bubble > plain.bubble      # element-wise waits too


def test_an_optimizer_step_at_the_memory_floor_moves_each_parameters_values_once():
    # a fused AdamW reads weight, gradient and two moments and writes three: 7 fp32 values
    assert traffic.optimizer_seconds(1e9, 3.35e12) == pytest.approx(28e9 / 3.35e12)
    assert traffic.optimizer_seconds(10, 1.0, "sgd", value_bytes=2) == 60
    with pytest.raises(ValueError, match="optimizer must be one of"):
        traffic.optimizer_seconds(10, 1.0, "adam")
    with pytest.raises(ValueError, match="bandwidth"):
        traffic.optimizer_seconds(10, 0.0)


def test_layer_traffic_splits_over_tensor_parallel_ranks():
    assert traffic.layer_values(1) == 69
    assert traffic.layer_values(2) == 30 + 39 / 2


def test_an_all_reduce_after_the_pipeline_is_all_exposed():
    late = replace(LECTURE, dp_overlap=False)
    t = step_time(GPT3, late, A100_CLUSTER, 1536)
    grads = 2 * GPT3.num_params / (8 * 16)
    assert t.dp_comm == pytest.approx(collective_time("all_reduce", grads, 8, A100_CLUSTER.inter))
    assert t.dp_comm >= step_time(GPT3, LECTURE, A100_CLUSTER, 1536).dp_comm


def test_bad_optimizer_and_overlap():
    with pytest.raises(ValueError, match="optimizer"):
        step_time(GPT3, LECTURE, A100_CLUSTER, 1536, optimizer="lamb")
    with pytest.raises(TypeError, match="dp_overlap"):
        Parallelism(ParallelDims(), dp_overlap="no")


def test_zero3_gathers_the_parameters_for_every_microbatch():
    """ZeRO-3 keeps only shards: each micro-batch all-gathers the parameters for its forward
    and again for its backward, and reduce-scatters its gradients (DeepSpeed's stage 3
    re-gathers per micro-batch), so m micro-batches cost m times one; ZeRO-2 gathers once."""
    gpt3, link = PRESETS["GPT-3 175B"], A100_CLUSTER.inter
    z2, z3 = (Parallelism(ParallelDims(dp=8, tp=8, pp=16), Recipe(zero_stage=z)) for z in (2, 3))
    n = gpt3.num_params
    gather = collective_time("all_gather", 2 * n / (8 * 16), 8, link)
    one = grad_sync_seconds(n, 2, z3, 8, link, 1)
    for m in (2, 4, 192):
        assert grad_sync_seconds(n, 2, z3, 8, link, m) == pytest.approx(m * one, rel=1e-12)
        extra = grad_sync_seconds(n, 2, z3, 8, link, m) - grad_sync_seconds(n, 2, z2, 8, link, m)
        assert extra == pytest.approx((2 * m - 1) * gather, rel=1e-9)
    def dp_comm(z, batch):
        return step_time(gpt3, Parallelism(ParallelDims(dp=8, tp=8, pp=16),
                                           Recipe(microbatch_size=1, zero_stage=z)),
                         A100_CLUSTER, batch).dp_comm
    assert dp_comm(3, 1536) > 100 * dp_comm(3, 8)          # 192 micro-batches, 192 rounds


def test_zero2_reduce_scatters_every_microbatch():
    """ZeRO-2 keeps only its gradient shard: m micro-batches, m reductions of the gradients;
    ZeRO-1 accumulates full gradients and reduces once. One micro-batch: the same."""
    gpt3 = PRESETS["GPT-3 175B"]
    link = A100_CLUSTER.inter
    for m in (1, 4, 192):
        z1, z2 = (Parallelism(ParallelDims(dp=8, tp=8, pp=16), Recipe(zero_stage=z))
                  for z in (1, 2))
        n = gpt3.num_params
        assert grad_sync_bytes(n, 2, z2, m) == m * grad_sync_bytes(n, 2, z1, m)
        one, two = (grad_sync_seconds(gpt3.num_params, 2, p, 8, link, m) for p in (z1, z2))
        if m == 1:
            assert two == pytest.approx(one, rel=1e-12)
        else:
            assert two > one * (m + 1) / 2 * 0.99          # m reduce-scatters + one all-gather
    def steps(batch):
        return [step_time(gpt3, Parallelism(ParallelDims(dp=8, tp=8, pp=16),
                                            Recipe(microbatch_size=1, zero_stage=z)),
                          A100_CLUSTER, batch) for z in (1, 2)]
    t1, t2 = steps(1536)
    assert t2.microbatches == 192 and t2.dp_comm > t1.dp_comm and t2.total > t1.total
    t1, t2 = steps(8)
    assert t1.microbatches == 1 and t2.dp_comm == pytest.approx(t1.dp_comm, rel=1e-12)
