"""The memory model (lecture_lib.costmodel.memory) against its sources."""
import pytest

from lecture_lib import costmodel as cm


def test_zero_paper_figure_1():
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, 64 GPUs, K = 12
    got = [cm.model_state_bytes(7.5e9, dp_size=64, zero_stage=s) / 1e9 for s in range(4)]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]


def test_breakdown_divides_what_each_stage_shards():
    b = cm.model_state_breakdown(1000, 4, 2, optimizer_bytes_per_param=12)
    assert (b["params"], b["grads"], b["optimizer"]) == (2000, 500, 3000)
    assert b["total"] == cm.model_state_bytes(1000, 4, 2)


def test_korthikanti_table_2():
    s, b, h, a, t = 2048, 1, 12288, 96, 8          # GPT-3 175B: 5 a s / h = 80 (the paper, sec. 4)
    sbh = s * b * h
    f = cm.activation_bytes_per_layer
    assert f(s, b, h, a) == sbh * (34 + 80)
    assert f(s, b, h, a, tp=t) == pytest.approx(sbh * (10 + 24 / t + 80 / t))
    assert f(s, b, h, a, tp=t, sequence_parallel=True) == pytest.approx(sbh * (34 + 80) / t)
    assert f(s, b, h, a, tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert f(s, b, h, a, tp=t, sequence_parallel=True, recompute="selective") == \
        pytest.approx(sbh * 34 / t)
    assert f(s, b, h, a, recompute="full") == 2 * sbh


def test_gpt3_on_80gb_devices():
    assert [cm.min_devices_for_states(175e9, s) for s in range(4)] == [None, None, None, 35]


def test_memory_per_device_divides_by_tp_and_pp():
    gpt3 = cm.PRESETS["GPT-3 175B"]
    one = cm.memory_per_device(gpt3)
    split = cm.memory_per_device(gpt3, tp=8, pp=4)
    assert split["params"] == pytest.approx(one["params"] / 32)
    assert one["params"] == 2 * 175e9
    assert split["total"] == pytest.approx(sum(v for k, v in split.items() if k != "total"))


@pytest.mark.parametrize("call, match", [
    (lambda: cm.model_state_bytes(-1), "num_params must be >= 0"),
    (lambda: cm.model_state_bytes(10, dp_size=0), "dp_size must be >= 1"),
    (lambda: cm.model_state_bytes(10, zero_stage=4), "unknown ZeRO stage"),
    (lambda: cm.activation_bytes_per_layer(-5, 1, 64, 4), "seq_len must be >= 1"),
    (lambda: cm.activation_bytes_per_layer(8, 1, 64, 4, recompute="some"), "recompute"),
    (lambda: cm.memory_per_device(cm.PRESETS["GPT-3 175B"], pp=5), "do not split"),
    (lambda: cm.memory_per_device(cm.PRESETS["GPT-3 175B"], microbatch_size=-2), "microbatch_size"),
    (lambda: cm.TransformerShape("x", -1, 8, 2, 10, 4), "layers must be >= 1"),
])
def test_bad_sizes_are_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_autocast_keeps_fp32_states_and_16_bit_activations():
    """bf16 autocast (fp32 weights, gradients and Adam state; 16-bit activations): the states
    of fp32, the activations of mixed precision. ZeRO-1 at dp 4: 4 + 4 + 8/4 = 10 bytes."""
    shape = cm.PRESETS["GPT-3 175B"]
    auto, mixed, fp32 = (cm.memory_per_device(shape, 4, 8, 16, 1, precision=p)
                         for p in ("autocast (bf16 compute, fp32 weights)",
                                   "mixed (bf16/fp16 + fp32 master)", "fp32"))
    for kind in ("params", "grads", "optimizer"):
        assert auto[kind] == fp32[kind]
    assert auto["activations"] == mixed["activations"] == fp32["activations"] / 2
    per_param = sum(auto[k] for k in ("params", "grads", "optimizer")) / (shape.num_params / 128)
    assert per_param == pytest.approx(10)
