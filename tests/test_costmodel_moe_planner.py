"""Expert parallelism in the planner: an MoE model's parameters, memory and step time
against hand-computed values, the ep = 1 reduction to the dense model with E experts, bad
input, and how memory and all-to-all time move with ep and with the node boundary."""
from dataclasses import replace

import pytest

from lecture_lib.costmodel import (
    H100_CLUSTER,
    MoESpec,
    TransformerShape,
    all_to_all_bytes,
    dispatch_buffer_bytes,
    memory_per_device,
    memory_per_device_ep,
    mlp_params,
    moe_param_split,
)
from lecture_lib.costmodel.comm import Link, collective_time
from lecture_lib.costmodel.planner import (
    expert_parallel_step,
    explain_expert_parallel,
    plan_expert_parallel,
)
from lecture_lib.costmodel.steptime import Cluster, Parallelism, step_time
from lecture_lib.dims import ParallelDims, Recipe

# a tiny model whose every number is worked by hand below
TINY = TransformerShape("tiny", layers=2, hidden=4, heads=2, vocab=8, seq_len=4, num_params=1000)
TINY_MOE = MoESpec(num_experts=4, k=2, d_ff=8)
INTRA, INTER = Link("intra", 1e-3, 1e5), Link("inter", 1e-3, 1e4)
TOY = Cluster("2 nodes x 2", nodes=2, gpus_per_node=2, peak_flops=1e6, memory_bytes=1e12,
              intra=INTRA, inter=INTER, efficiency=0.5)
DP4 = Parallelism(ParallelDims(dp=4), Recipe(microbatch_size=1))

# Mixtral 8x7B (Jiang et al. 2024, arXiv 2401.04088, Table 1) on Mistral 7B's shape
H, L, F, V = 4096, 32, 14336, 32000
MISTRAL = TransformerShape("Mistral 7B", L, H, 32, V, 4096,
                           L * (2 * H * H + 2 * H * (H // 4) + 3 * H * F + 2 * H) + 2 * V * H + H)
MIXTRAL = MoESpec(num_experts=8, k=2, d_ff=F, gated=True)


def test_tiny_parameters_by_hand():
    assert mlp_params(4, 8) == 2 * 4 * 8 + 8 + 4 == 76
    assert mlp_params(4, 8, gated=True) == 3 * 4 * 8 + 2 * 8 + 4
    # dense: 1000 less 2 MLPs, plus 2 routers of 4 x 4; experts: 2 layers x 4 x 76
    assert moe_param_split(TINY, TINY_MOE) == {"dense": 880, "expert": 608, "total": 1488,
                                               "active": 880 + 2 * 2 * 76}
    padded = moe_param_split(TINY, replace(TINY_MOE, capacity_factor=1.5))
    assert padded["active"] == 880 + 1.5 * 2 * 2 * 76          # padded slots are computed too


def test_mixtral_matches_its_paper():
    """47B parameters, 13B active per token (Mixtral paper, section 2)."""
    split = moe_param_split(MISTRAL, MIXTRAL)
    assert round(split["total"] / 1e9) == 47 and round(split["active"] / 1e9) == 13


def test_tiny_memory_by_hand():
    mem = memory_per_device_ep(TINY, TINY_MOE, ep=2, dp=4)
    assert mem["experts"] == 608 / 2 * 16                       # E/ep experts, 16 bytes each
    assert mem["params"] + mem["grads"] + mem["optimizer"] == 880 * 16 + 608 / 2 * 16
    # Korthikanti: s b h (34 + 5 a s / h) = 16 * 44 per layer; the MoE layer's 2 experts of
    # width 8 keep 2 * 4 * (3*4 + 4*8) against the dense 4h MLP's 4 * 19 * 4
    assert mem["activations"] == 2 * 16 * 44 + 2 * (2 * 4 * 44 - 4 * 19 * 4)
    assert mem["total"] == 14080 + 4864 + 1504


def test_tiny_step_by_hand():
    t, a2a, links = expert_parallel_step(TINY, TINY_MOE, 2, DP4, TOY, global_batch=4)
    assert t.compute == pytest.approx((6 * 1184 + 12 * 2 * 4 * 4) * 16 / 4 / 5e5)   # 0.059904 s
    # dense gradients over 4 ranks, experts' over dp/ep = 2, both on the inter-node link
    sync = (6e-3 + 1.5 * 2 * 880 / 1e4) + (2e-3 + 1.0 * 2 * 608 / 2 / 1e4)
    assert t.dp_comm == pytest.approx(sync - t.compute * 2 / 3)
    # 4 all-to-alls per MoE layer and micro-batch, 2 layers, 1 micro-batch; the ep group of
    # 2 adjacent dp ranks fits in a node: alpha + 1/2 of 4 tokens x k=2 x h=4 x 2 bytes
    assert a2a == pytest.approx(8 * (1e-3 + 0.5 * 64 / 1e5))
    assert links == {"all-to-all": "intra", "gradients": "inter"}
    assert t.total + a2a == pytest.approx(0.059904 + (0.3328 - 0.039936) + 0.01056)


def test_dispatch_bytes_are_the_all_to_all_formula():
    assert all_to_all_bytes(10, 4, 2, 4, 2) == 0.75 * dispatch_buffer_bytes(10, 4, 2, 2)
    assert collective_time("all_to_all", dispatch_buffer_bytes(10, 4, 2, 2), 4, Link("x", 0, 1)) \
        == all_to_all_bytes(10, 4, 2, 4, 2)


def test_ep_1_is_the_dense_model_with_all_experts():
    whole = replace(TINY, num_params=1488)
    mem = memory_per_device_ep(TINY, TINY_MOE, ep=1, dp=4, zero_stage=1)
    ref = memory_per_device(whole, dp=4, zero_stage=1)
    for kind in ("params", "grads", "optimizer"):
        assert mem[kind] == pytest.approx(ref[kind])
    t, a2a, _ = expert_parallel_step(TINY, TINY_MOE, 1, DP4, TOY, global_batch=4)
    active = step_time(replace(TINY, num_params=1184), DP4, TOY, 4)
    assert a2a == 0.0
    assert (t.compute, t.bubble, t.tp_comm, t.pp_comm) == \
        (active.compute, active.bubble, active.tp_comm, active.pp_comm)
    one_allreduce = collective_time("all_reduce", 2 * 1488, 4, INTER)   # one group, one call
    assert t.dp_comm == pytest.approx(one_allreduce - t.compute * 2 / 3)


@pytest.mark.parametrize("call, match", [
    (lambda: memory_per_device_ep(TINY, TINY_MOE, ep=3, dp=6), "does not divide the 4 experts"),
    (lambda: memory_per_device_ep(TINY, TINY_MOE, ep=4, dp=2), "must divide dp=2"),
    (lambda: expert_parallel_step(TINY, TINY_MOE, 8, DP4, TOY, 4), "must divide dp=4"),
    (lambda: MoESpec(num_experts=2, k=3, d_ff=8), "larger than the number of experts"),
    (lambda: MoESpec(num_experts=2, k=1, d_ff=8, capacity_factor=0), "capacity_factor"),
    (lambda: plan_expert_parallel(TINY, TINY_MOE, TOY, 4, eps=(1, 3)), r"ep in \[3\]"),
    (lambda: moe_param_split(TINY, MoESpec(4, 1, d_ff=100)), "cannot hold"),
])
def test_bad_input_raises_clearly(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_larger_ep_lowers_expert_memory():
    for zero in (0, 1, 2):
        mem = [memory_per_device_ep(MISTRAL, MIXTRAL, ep, dp=64, zero_stage=zero)
               for ep in (1, 2, 4, 8)]
        experts = [m["experts"] for m in mem]
        assert all(a > b for a, b in zip(experts, experts[1:])), zero
        assert all(a["total"] > b["total"] for a, b in zip(mem, mem[1:])), zero
    plain = [memory_per_device_ep(MISTRAL, MIXTRAL, ep, dp=64)["experts"] for ep in (1, 8)]
    assert plain[0] / plain[1] == pytest.approx(8)        # no ZeRO: E/ep experts, all states
    # ZeRO-3 shards the experts' states over the dp/ep ranks that share them: dp/ep x ep = dp
    z3 = [memory_per_device_ep(MISTRAL, MIXTRAL, ep, dp=64, zero_stage=3)["experts"]
          for ep in (1, 8)]
    assert z3[0] == pytest.approx(z3[1])


def test_all_to_all_slows_when_the_ep_group_leaves_the_node():
    par = Parallelism(ParallelDims(dp=64), Recipe(microbatch_size=1, zero_stage=1))
    _, inside, links_in = expert_parallel_step(MISTRAL, MIXTRAL, 8, par, H100_CLUSTER, 512)
    half_nodes = replace(H100_CLUSTER, gpus_per_node=4, nodes=256)
    _, across, links_out = expert_parallel_step(MISTRAL, MIXTRAL, 8, par, half_nodes, 512)
    assert links_in["all-to-all"] == H100_CLUSTER.intra.name
    assert links_out["all-to-all"] == H100_CLUSTER.inter.name
    assert across > 5 * inside                       # 300 GB/s NVLink against 45 GB/s NDR
    # and placing tp inside the node first pushes an ep group of 8 x tp 2 across nodes
    tp2 = Parallelism(ParallelDims(dp=32, tp=2), Recipe(microbatch_size=1, zero_stage=1),
                      inner="tp")
    assert expert_parallel_step(MISTRAL, MIXTRAL, 8, tp2, H100_CLUSTER, 512)[2]["all-to-all"] \
        == H100_CLUSTER.inter.name


def test_planner_spreads_mixtral_experts_in_a_node():
    plans = plan_expert_parallel(MISTRAL, MIXTRAL, H100_CLUSTER, 512, devices=64)
    best = plans[0]
    assert best.ep == 8 and best.links["all-to-all"] == H100_CLUSTER.intra.name
    assert best.plan.memory["total"] <= H100_CLUSTER.memory_bytes
    assert all(p.seconds >= best.seconds for p in plans)
    words = explain_expert_parallel(best, plans)
    assert words.startswith("Best: dp") and "best with ep=1" in words
