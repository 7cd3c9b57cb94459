"""The context-parallel cost model against its derivations, and the planner's cp axis."""
from dataclasses import replace

import pytest

from lecture_lib import costmodel as cm
from lecture_lib.costmodel.context_parallel import (
    cp_activation_bytes_per_layer,
    cp_exposed_comm,
    gpt_block_activation_bytes,
    memory_per_device_cp,
    ring_bytes_per_layer,
    ulysses_bytes_per_layer,
)
from lecture_lib.costmodel.planner import plan_context_parallel


def test_activations_divide_by_cp():
    s, b, h, a = 131072, 1, 8192, 64
    one = cm.activation_bytes_per_layer(s, b, h, a, tp=8, sequence_parallel=True)
    assert cp_activation_bytes_per_layer(s, b, h, a, cp=16, tp=8, sequence_parallel=True) == \
        pytest.approx(one / 16)
    assert gpt_block_activation_bytes(64, 2, 32, 4, cp=4) == 2 * 16 * (17 * 32 + 4 + 4) * 4
    assert gpt_block_activation_bytes(64, 2, 32, 4, attention="sdpa") == \
        2 * 64 * (16 * 32 + 8) * 4
    with pytest.raises(ValueError, match="does not split over cp=3"):
        gpt_block_activation_bytes(64, 1, 32, 4, cp=3)


def test_ring_sends_k_and_v_cp_minus_one_times():
    bsh = 2 * 1024 * 64 * 2
    assert ring_bytes_per_layer(2, 1024, 64, 4) == {"forward": 2 * 3 / 4 * bsh,
                                                    "backward": 2 * 7 / 4 * bsh}
    assert ring_bytes_per_layer(2, 1024, 64, 1) == {"forward": 0.0, "backward": 0.0}
    # Ulysses: 4 all-to-alls of b s h / cp, (cp - 1)/cp of each leaves the rank
    assert ulysses_bytes_per_layer(2, 1024, 64, 4)["forward"] == pytest.approx(4 * 3 / 16 * bsh)
    ratios = [ulysses_bytes_per_layer(1, 4096, 64, c)["forward"]
              / ring_bytes_per_layer(1, 4096, 64, c)["forward"] for c in (2, 4, 8)]
    assert ratios == pytest.approx([1.0, 0.5, 0.25])                  # 2 / cp


def test_grouped_query_attention_narrows_what_moves():
    # Llama 3 8B: h = 4096, 8 K/V heads of 128 (K and V 1024 wide), 128K tokens, cp = 8, bf16
    ring = ring_bytes_per_layer(1, 131072, 4096, 8, kv_width=1024)
    assert ring == ring_bytes_per_layer(1, 131072, 1024, 8)           # only K and V travel
    gqa, mha = (ulysses_bytes_per_layer(1, 131072, 4096, 8, kv_width=w) for w in (1024, None))
    assert gqa["forward"] == mha["forward"] * (2 * 4096 + 2 * 1024) / (4 * 4096)  # q, o stay h
    assert ulysses_bytes_per_layer(2, 1024, 64, 4, kv_width=64) == \
        ulysses_bytes_per_layer(2, 1024, 64, 4)
    assert gqa["forward"] + gqa["backward"] < ring["forward"] + ring["backward"]


def test_exposed_ring_time_is_zero_when_attention_hides_it():
    shape = replace(cm.PRESETS["Llama-style 70B"], seq_len=131072)
    assert cp_exposed_comm(shape, 1, 1, cm.NVLINK_H100, 400e12) == 0.0
    assert cp_exposed_comm(shape, 1, 8, cm.NVLINK_H100, 400e12) == 0.0    # long blocks hide it
    assert cp_exposed_comm(shape, 1, 64, cm.INFINIBAND_NDR, 400e12) > 0   # short ones do not


def test_model_states_shard_over_dp_times_cp():
    shape = cm.PRESETS["Llama-style 70B"]
    a = memory_per_device_cp(shape, cp=4, dp=2, tp=8, zero_stage=1)
    b = cm.memory_per_device(shape, dp=8, tp=8, zero_stage=1)
    assert a["optimizer"] == pytest.approx(b["optimizer"])
    assert a["activations"] == pytest.approx(cm.memory_per_device(shape, tp=8)["activations"] / 4)


def test_planner_needs_cp_for_70b_at_128k_tokens():
    shape = replace(cm.PRESETS["Llama-style 70B"], seq_len=131072)
    plans = plan_context_parallel(shape, cm.H100_CLUSTER, 128)
    assert min(p.cp for p in plans) > 1                      # nothing fits without cp
    assert plans[0].cp > 1 and plans[0].seconds <= plans[-1].seconds
    with pytest.raises(ValueError, match="no configuration"):
        plan_context_parallel(shape, cm.H100_CLUSTER, 128, cps=(1,))


def test_a_context_parallel_plan_is_labelled_with_its_cp():
    shape = replace(cm.PRESETS["Llama-style 70B"], seq_len=131072)
    best = plan_context_parallel(shape, cm.H100_CLUSTER, 128)[0]
    assert best.plan.parallelism.dims.cp == 1            # the plan inside models one cp rank
    assert f"cp{best.cp} " in best.label() and "cp1 " not in best.label()
    d = best.plan.parallelism.dims
    assert d.dp * d.tp * d.pp * best.cp == cm.H100_CLUSTER.devices


def test_a_send_moves_its_whole_buffer():
    assert cm.bus_factor("send", 4) == 1.0
    assert cm.bus_factor("all_to_all", 4) == 0.75
    with pytest.raises(ValueError, match="unknown collective"):
        cm.bus_factor("gossip", 4)
