"""metrics: phase timers, saved-tensor bytes, state bytes; costmodel.comm formulas."""
import subprocess
import sys
import time

import pytest
import torch

from lecture_lib import costmodel, metrics
from lecture_lib.costmodel.comm import naive_all_reduce_time
from lecture_lib.models import GPT, GPTConfig, MarkovText


def test_timer_splits_phases_and_records_spans():
    timer = metrics.Timer()
    with timer("compute"):
        time.sleep(0.03)
    with timer("comm"):
        time.sleep(0.01)
    # a sleep lasts at least what it asks for, however busy the machine (longer: any amount)
    assert timer.totals["compute"] >= 0.03 and timer.totals["comm"] >= 0.01
    assert 0 < timer.share("compute") < 1
    assert timer.share("compute") + timer.share("comm") == pytest.approx(1)
    (k1, s1, e1), (k2, s2, e2) = timer.spans
    assert (k1, k2) == ("compute", "comm") and 0 <= s1 < e1 <= s2 < e2


def test_tokens_per_second():
    assert metrics.tokens_per_second(1000, 0.5) == 2000
    with pytest.raises(ValueError):
        metrics.tokens_per_second(1, 0)


def test_saved_bytes_grow_with_depth_and_batch():
    def saved(layers, batch):
        cfg = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=4, n_layers=layers)
        model, (x, y) = GPT(cfg), MarkovText(32, 16).batch(0, batch)
        with metrics.saved_tensor_bytes() as s:
            model(x, y)
        return s.activation_bytes(model)
    one, two = saved(1, 4), saved(2, 4)
    assert two > one > 0
    assert saved(2, 8) > 1.8 * saved(2, 4) - 1


def test_state_bytes_counts_params_grads_and_adam_state():
    model = torch.nn.Linear(10, 10)          # 110 float32 parameters = 440 bytes
    opt = torch.optim.Adam(model.parameters())
    assert metrics.state_bytes(model, opt) == {"params": 440, "grads": 0, "optimizer": 0}
    model(torch.randn(2, 10)).sum().backward()
    opt.step()
    got = metrics.state_bytes(model, opt)
    assert got["grads"] == 440 and got["optimizer"] >= 880   # exp_avg + exp_avg_sq (+ steps)


def test_bus_factors_match_nccl_tests():
    assert costmodel.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert costmodel.bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert costmodel.bus_factor("reduce_scatter", 1) == 0
    with pytest.raises(ValueError):
        costmodel.bus_factor("scan", 4)


def test_collective_time_and_fit_round_trip():
    link = costmodel.Link("test", alpha=1e-5, beta=1e9)
    assert costmodel.collective_time("all_reduce", 1e6, 1, link) == 0
    t = costmodel.collective_time("all_reduce", 4e6, 4, link)
    assert t == pytest.approx(6 * 1e-5 + 1.5 * 4e6 / 1e9)
    sizes = [2.0 ** k for k in range(10, 26)]
    alpha, beta = costmodel.fit_alpha_beta(sizes, [2e-5 + s / 3e9 for s in sizes])
    assert alpha == pytest.approx(2e-5, rel=1e-6) and beta == pytest.approx(3e9, rel=1e-6)
    with pytest.raises(ValueError):
        costmodel.fit_alpha_beta([1.0], [1.0])


def test_naive_all_reduce_time_against_the_ring():
    link = costmodel.Link("test", alpha=1e-5, beta=1e9)
    assert naive_all_reduce_time(1e6, 1, link) == 0
    # two latencies; the root's link carries 2 (p-1) whole buffers
    assert naive_all_reduce_time(4e6, 4, link) == pytest.approx(2e-5 + 6 * 4e6 / 1e9)
    latency_only = costmodel.Link("latency", alpha=1.0, beta=float("inf"))
    bandwidth_only = costmodel.Link("bandwidth", alpha=0.0, beta=1.0)
    for p in (2, 4, 8):      # fewer latencies than the ring's 2 (p-1); p times its bytes
        assert naive_all_reduce_time(1.0, p, latency_only) == 2
        assert naive_all_reduce_time(1.0, p, bandwidth_only) == pytest.approx(
            p * costmodel.collective_time("all_reduce", 1.0, p, bandwidth_only))
    for bad in [(-1.0, 2), (1.0, 0)]:
        with pytest.raises(ValueError):
            naive_all_reduce_time(*bad, link)


def test_training_days_inverts_mfu_and_gives_llama3s_budget():
    fpt = metrics.model_flops_per_token(405_000_000_000)         # 6 N, N = 405e9
    assert fpt * 15.6e12 == pytest.approx(3.8e25, rel=0.01)       # Llama 3 paper: 3.8e25 FLOPs
    days = metrics.training_days(fpt, 15.6e12, 989e12, 16384, 0.4)
    tokens_per_s = 15.6e12 / (days * 86400)
    assert metrics.mfu(tokens_per_s, fpt, 989e12, 16384) == pytest.approx(0.4)
    for bad in [(0, 1, 1, 1, 0.5), (1, 1, 1, 0, 0.5), (1, 1, 1, 1, 0), (1, 1, 1, 1, 1.5)]:
        with pytest.raises(ValueError):
            metrics.training_days(*bad)


def test_metrics_does_not_import_the_emulation():
    """metrics sits below the emulation: it learns of a virtual clock through its own hook."""
    code = "import lecture_lib.metrics, sys; assert 'lecture_lib.emulate' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_timers_read_the_registered_clock_source():
    class FakeClock:
        label, t, synchronized = "Fake GPU", 10.0, 0

        def now(self):
            return self.t

        def synchronize(self):
            self.synchronized += 1
            return self.t

    clock, active = FakeClock(), [None]
    previous = metrics.set_clock_source(lambda: active[0])
    try:
        assert metrics.time_kind() == "real"                  # a source that reports no clock
        active[0] = clock
        assert metrics.time_kind() == "emulated Fake GPU"
        timer = metrics.Timer()
        with timer("compute"):
            clock.t += 0.5
        assert timer.totals["compute"] == 0.5 and timer.spans == [("compute", 0.0, 0.5)]
        assert timer.time_kind == "emulated Fake GPU" and clock.synchronized == 0
        with metrics.wall_time() as t:
            clock.t += 0.25
        assert t.seconds == 0.25 and clock.synchronized == 2    # wall_time waits for both streams
        with pytest.raises(TypeError, match="clock source"):
            metrics.set_clock_source("not a function")
    finally:
        metrics.set_clock_source(previous)
    assert metrics.set_clock_source(previous) is previous
