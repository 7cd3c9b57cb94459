"""lecture_lib.emulate's calibrated charges: kernels, launches, waves, attention, optimizers, NCCL.

Each expected value is computed from the preset's constants and the model's
formula (lecture_lib/emulate/kernels.py, compute.py, nccl.py), never read back from a run.
"""
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import lecture_lib
from lecture_lib import emulate
from lecture_lib.emulate import nccl
from lecture_lib.emulate.kernels import (
    FlashAttention,
    by_head_dim,
    fit_fill,
    fit_flash_attention,
    fit_gemm,
    gemm_seconds,
)

H100, A100 = emulate.preset("h100-node"), emulate.preset("a100-node")
D = H100.device


def _close(a, b, rel=1e-6):
    assert abs(a - b) <= rel * abs(b), (a, b)


def test_small_kernels_are_launch_bound_in_eager_and_kernel_bound_under_graphs():
    x = torch.randn(64)
    for launch in ("eager", "graphs"):
        with emulate.emulated("h100-node", launch=launch) as clock:
            for _ in range(100):
                x = x + 1
        bytes_each = 2 * 64 * 2 / (D.memory_bandwidth * D.memory_efficiency)
        # eager: the host launches one op per 5 us and each kernel lasts 2.5 us + its bytes
        expected = (100 * D.launch_seconds + D.kernel_seconds + bytes_each if launch == "eager"
                    else 100 * (D.kernel_seconds + bytes_each))
        _close(clock.now(), expected)


def test_item_makes_the_host_wait_for_the_gpu():
    a = torch.randn(2048, 2048)
    with emulate.emulated("h100-node") as clock:
        b = a @ a                       # a long kernel, launched at 5 us
        b.sum().item()                  # the host waits for it
        waited = clock.host
        assert waited == clock.compute > 3 * D.launch_seconds
        b + 1                           # launched 5 us after the wait
        assert clock.host == waited + D.launch_seconds
        assert clock.compute > clock.host + D.kernel_seconds


def test_a_matmul_pays_its_waves_and_the_achieved_rate():
    # 1024^3 in bf16 on an A100: 64 tiles of 128 x 128 on 108 SMs keep 64/108 of them busy
    a = torch.randn(1024, 1024, dtype=torch.bfloat16)
    with emulate.emulated("a100-node", launch="graphs") as clock:
        a @ a
    d = A100.device
    rate = d.bf16_flops * d.matmul_efficiency * 64 / 108
    _close(clock.now(), d.kernel_seconds + d.matmul_fill_seconds + 2 * 1024 ** 3 / rate)


def test_attention_is_charged_its_flops_on_any_backend_halved_when_causal():
    q, k, v = (torch.randn(2, 4, 256, 64, requires_grad=True) for _ in range(3))
    per = {}
    for causal in (False, True):
        with emulate.emulated("h100-node") as clock:
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()
        per[causal] = clock.flops
    forward = 4 * 2 * 4 * 256 * 256 * 64          # QK^T and PV: 2 matmuls of 2 b h s^2 d
    backward = 2.5 * forward                      # torch's SDPA backward formula
    assert per[False] == forward + backward
    assert per[True] == (forward + backward) / 2


def _adam_step(optimizer):
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(8)])   # 16 params
    model(torch.randn(4, 32)).sum().backward()
    opt = torch.optim.AdamW(model.parameters())
    with emulate.emulated("h100-node", optimizer=optimizer) as clock:
        opt.step()
    return clock


def test_the_optimizer_is_charged_as_the_gpu_runs_it():
    as_run, foreach, fused = (_adam_step(o) for o in ("as-run", "foreach", "fused"))
    kernels = {name: round(c.host / D.launch_seconds)
               for name, c in (("as-run", as_run), ("foreach", foreach), ("fused", fused))}
    assert kernels["fused"] == 1
    assert kernels["foreach"] < 20 <= 5 * 16 <= kernels["as-run"]   # per op, not per param
    assert fused.now() < foreach.now() < as_run.now()
    # the same bytes: one fused kernel, or k foreach kernels launched 5 us apart (each shorter
    # than its launch: the last one ends a kernel's cost and its share of bytes after it)
    k = kernels["foreach"]
    update = fused.now() - D.launch_seconds - D.kernel_seconds
    _close(foreach.now(), k * D.launch_seconds + D.kernel_seconds + update / k)


def test_nccl_picks_ll_for_small_messages_and_nvls_or_ring_for_large():
    small, _ = H100.collective_choice("all_reduce", 4096, range(8))
    assert small == "ring/LL"
    # LL: 6.6 us + 14 steps of 0.6 us, far below the alpha-beta ring's 14 x 3 us
    assert H100.collective_seconds("all_reduce", 4096, range(8)) < 20e-6
    assert H100.collective_choice("all_reduce", 2 ** 30, range(8))[0] == "NVLS/Simple"
    assert A100.collective_choice("all_reduce", 2 ** 30, range(8))[0] == "ring/Simple"
    assert H100.collective_choice("all_gather", 2 ** 30, range(8))[0] == "ring/Simple"
    # across two nodes the ring runs at the network's bandwidth
    across = H100.collective_seconds("all_reduce", 2 ** 30, range(16))
    # 2 (16 - 1) = 30 steps, of which 2 cross the network
    _close(across, nccl.SIMPLE_BASE + 2 * H100.inter_fabric.step_latency
           + 28 * H100.intra_fabric.step_latency
           + nccl.bus_bytes("all_reduce", 2 ** 30, 16) / H100.inter_fabric.busbw)


def test_fit_line_goes_through_both_points():
    step, busbw = nccl.fit_line((2 ** 24, 100e9), (2 ** 33, 200e9), 14, nccl.SIMPLE_BASE)
    for n, bw in ((2 ** 24, 100e9), (2 ** 33, 200e9)):
        moved = nccl.bus_bytes("all_reduce", n, 8)
        _close(moved / (nccl.SIMPLE_BASE + 14 * step + moved / busbw), bw)
    with pytest.raises(ValueError, match="no line"):
        nccl.fit_line((2 ** 24, 300e9), (2 ** 33, 200e9), 14, nccl.SIMPLE_BASE)


def _two_rank_all_reduce(n):
    x = torch.ones(n // 4)
    with emulate.emulated("h100-node") as clock:
        torch.distributed.all_reduce(x)
    return clock.now()


def test_a_real_all_reduce_is_charged_nccl_choice():
    for n in (4096, 1 << 24):
        for t in lecture_lib.run(_two_rank_all_reduce, 2, n, timeout=60):
            _close(t, H100.collective_seconds("all_reduce", n, [0, 1]))


@pytest.mark.parametrize("change, message", [
    ({"charges": "exact"}, "charges must be one of"),
    ({"launch": "compiled"}, "launch must be one of"),
    ({"optimizer": "lazy"}, "optimizer must be one of"),
    ({"intra_fabric": None}, "calibrated charges need intra_fabric")])
def test_bad_charges_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        emulate.preset("h100-node", **change)


def test_bad_device_constants_are_refused():
    base = dict(bf16_flops=1e12, tf32_flops=1e12, fp32_flops=1e12, memory_bandwidth=1e12)
    for change, message in (({"matmul_efficiency": 1.5}, "fraction"),
                            ({"kernel_seconds": -1.0}, ">= 0"), ({"sms": 0}, "sms"),
                            ({"launch_seconds": math.nan}, ">= 0")):
        with pytest.raises(ValueError, match=message):
            emulate.Device("bad", **base, **change)


def test_reshapes_and_metadata_queries_launch_nothing():
    # a 3-d input through a Linear: matmul runs mm on a flattened view and returns its output
    # as _unsafe_view (no copy); prim::device is fake tensors' metadata query
    x, lin = torch.randn(4, 8, 32), torch.nn.Linear(32, 16)
    with emulate.emulated("h100-node", launch="graphs") as clock:
        lin(x)
    a, w = x.view(32, 32), lin.weight.detach().t()
    with emulate.emulated("h100-node", launch="graphs") as one:
        torch.addmm(lin.bias.detach(), a, w)
    _close(clock.now(), one.now())              # one kernel (addmm), not two


def test_a_label_names_charges_that_are_not_the_default():
    assert emulate.label("h100-node") == "emulated H100 + NVLink"
    assert emulate.label(emulate.preset("h100-node", launch="graphs")) == \
        "emulated H100 + NVLink, CUDA graphs"
    assert emulate.label(emulate.preset("a100-ib", charges="roofline")) == \
        "emulated A100 + InfiniBand, roofline"


def test_a_weight_gradient_is_split_along_k_when_its_output_has_few_tiles():
    # 256 x 16384 @ 16384 x 256: 4 output tiles for 132 SMs, split 33 ways along k: every SM busy
    a = torch.empty(256, 16384, dtype=torch.bfloat16, device="meta")
    b = torch.empty(16384, 256, dtype=torch.bfloat16, device="meta")
    seconds, flops, nbytes = emulate.op_cost(torch.ops.aten.mm.default, (a, b), {}, a @ b, H100)
    rate = D.bf16_flops * D.matmul_efficiency
    bandwidth = D.memory_bandwidth * D.memory_efficiency
    fixed = D.kernel_seconds + D.matmul_fill_seconds
    _close(seconds, fixed + max(flops / rate, nbytes / bandwidth))
    # a short k cannot be split: 4 tiles of 132 SMs busy
    a, b = a[:, :256], b[:256]
    seconds, flops, _ = emulate.op_cost(torch.ops.aten.mm.default, (a, b), {}, a @ b, H100)
    _close(seconds, fixed + flops / (rate * 4 / 132))


def test_a_matmul_fills_its_pipeline_on_top_of_a_kernels_least_time():
    # the same small matmul with and without the fill: the fill alone tells them apart, and a
    # roofline cluster pays neither
    a = torch.empty(256, 256, dtype=torch.bfloat16, device="meta")
    mm = torch.ops.aten.mm.default
    no_fill = emulate.preset("h100-node", device=replace(D, matmul_fill_seconds=0.0))
    _close(emulate.op_cost(mm, (a, a), {}, a @ a, H100)[0]
           - emulate.op_cost(mm, (a, a), {}, a @ a, no_fill)[0], D.matmul_fill_seconds)
    roofline = emulate.preset("h100-node", charges="roofline")
    flops = 2 * 256 ** 3
    _close(emulate.op_cost(mm, (a, a), {}, a @ a, roofline)[0],
           max(flops / D.bf16_flops, 3 * 2 * 256 ** 2 / D.memory_bandwidth))


SDPA_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _sdpa_seconds(cluster, shape, causal, backward=False):
    """Emulated seconds of one CPU flash-attention kernel (the GPU's stand-in) on meta tensors."""
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q, k, v, out, grad = (torch.empty(shape, dtype=torch.bfloat16, device="meta")
                          for _ in range(5))
    lse = torch.empty(shape[:-1], dtype=torch.float32, device="meta")
    if backward:
        return emulate.op_cost(SDPA_BACKWARD, (grad, q, k, v, out, lse, 0.0, causal), {},
                               (q, k, v), cluster)
    return emulate.op_cost(sdpa.default, (q, k, v, 0.0, causal), {}, (out, lse), cluster)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_runs_at_its_flash_kernels_measured_share(causal, backward):
    # 8 sequences of 4096 tokens, 16 heads of 128: 8 x 16 x 32 = 4096 query blocks, 31.03 waves
    shape = (8, 16, 4096, 128)
    seconds, flops, _ = _sdpa_seconds(H100, shape, causal, backward)
    fa = D.attention
    n, fill = 4096 / 128, fa.backward_fill if backward else fa.forward_fill
    useful = fa.causal * n / (n + 1 + 2 * fill) if causal else n / (n + fill)
    share = dict(fa.backward if backward else fa.forward)[128] * useful
    busy = 4096 / (32 * 132)
    _close(seconds, D.kernel_seconds + flops / (D.bf16_flops * share * busy))
    # FlashAttention-2 on an H100 reaches a third of the peak: far below a matmul's share
    assert 0.2 < share < 0.4 < D.matmul_efficiency


def test_attention_is_faster_per_flop_on_longer_sequences_and_without_a_mask():
    def rate(tokens, causal):
        seconds, flops, _ = _sdpa_seconds(H100, (16384 // tokens, 16, tokens, 128), causal)
        return flops / seconds
    assert rate(512, False) < rate(2048, False) < rate(16384, False)
    assert rate(512, True) < rate(512, False) and rate(16384, True) < rate(16384, False)
    # without a flash kernel's rates (a user-defined device) attention runs at the matmul's
    plain = emulate.preset("h100-node", device=replace(D, attention=None))
    seconds, flops, _ = _sdpa_seconds(plain, (1, 16, 16384, 128), False)
    _close(seconds, D.kernel_seconds + flops / (D.bf16_flops * D.matmul_efficiency * 2048 / 2112))


def test_a_head_dimension_between_the_measured_ones_is_interpolated_in_one_over_d():
    table = ((64, 0.30), (128, 0.40), (256, 0.35))
    assert by_head_dim(table, 64) == 0.30 and by_head_dim(table, 128) == 0.40
    assert by_head_dim(table, 512) == 0.35                      # past the last: the last
    # 1 / share linear in 1 / d: 1/96 is two thirds of the way from 1/64 to 1/128
    _close(by_head_dim(table, 96), 1 / (1 / 0.30 + (2 / 3) * (1 / 0.40 - 1 / 0.30)))
    assert by_head_dim(table, 32) < 0.30                       # below the first, lower still


def test_the_fill_is_recovered_from_two_rates():
    def rate(tokens, fill):                                     # the model's unmasked rate
        n = tokens / 128
        return 300e12 * n / (n + fill)
    for fill in (0.5, 2.0):
        _close(fit_fill((512, rate(512, fill)), (16384, rate(16384, fill))), fill)


def test_the_a100_shares_the_h100s_attention_shape_at_its_own_share_of_the_peak():
    a, h = A100.device.attention, D.attention
    assert (a.forward_fill, a.backward_fill, a.causal) == (h.forward_fill, h.backward_fill,
                                                          h.causal)
    ratios = {round(sa / sh, 12) for (_, sa), (_, sh) in zip(a.forward + a.backward,
                                                              h.forward + h.backward)}
    assert len(ratios) == 1                                     # one scale for every share
    with pytest.raises(TypeError, match="FlashAttention"):
        replace(D, attention={"forward": 0.3})
    with pytest.raises(ValueError, match=">= 0"):
        replace(D, matmul_fill_seconds=-1e-6)


def test_the_gemm_constants_are_recovered_from_two_gemms():
    device = replace(D, matmul_efficiency=1.0, matmul_fill_seconds=0.0)
    big, small = (1, 4096, 4096, 4096), (1, 256, 2048, 256)

    def measured(shape):                                   # made with known constants
        seconds = gemm_seconds(device, *shape, 0.8, 3e-6)
        return shape, 2 * math.prod(shape) / seconds
    efficiency, fill = fit_gemm(device, measured(big), measured(small))
    _close(efficiency, 0.8)
    _close(fill, 3e-6)


def test_the_flash_attention_constants_are_recovered_from_its_rates():
    truth = FlashAttention("toy", forward=((64, 0.3), (128, 0.35)), backward=((64, 0.25),
                           (128, 0.3)), forward_fill=0.8, backward_fill=2.0, causal=0.9)
    peak, sms = 1e15, 132
    rates = {}
    for pass_, d, tokens, causal in (("forward", 128, 512, False), ("forward", 128, 16384, False),
                                     ("forward", 64, 16384, False), ("forward", 128, 16384, True),
                                     ("backward", 128, 512, False),
                                     ("backward", 128, 16384, False),
                                     ("backward", 64, 16384, False)):
        waves = 2048 * 128 // d / (-(-(2048 * 128 // d) // sms) * sms)
        rates[pass_, d, tokens, causal] = peak * waves * truth.share(pass_ == "backward", d,
                                                                      tokens, causal)
    fitted = fit_flash_attention("toy", rates, peak, sms, "")
    for got, want in ((fitted.forward_fill, 0.8), (fitted.backward_fill, 2.0),
                      (fitted.causal, 0.9)):
        _close(got, want)
    for (d, got), (d_true, want) in zip(fitted.forward + fitted.backward,
                                        truth.forward + truth.backward):
        assert d == d_true
        _close(got, want)


def test_the_clock_splits_kernel_time_by_operation():
    """``seconds_by_op``: each kernel's charged seconds (launch waits not included) under its
    operation's name; an optimizer step's kernels under ``optimizer step``."""
    a = torch.randn(1024, 1024, dtype=torch.bfloat16)
    x = torch.randn(64)
    with emulate.emulated("a100-node", launch="graphs") as clock:
        a @ a
        for _ in range(3):
            x = x + 1
    d = A100.device
    rate = d.bf16_flops * d.matmul_efficiency * 64 / 108
    _close(clock.seconds_by_op["mm"],
           d.kernel_seconds + d.matmul_fill_seconds + 2 * 1024 ** 3 / rate)
    bytes_each = 2 * 64 * 2 / (d.memory_bandwidth * d.memory_efficiency)   # charged in 16 bits
    _close(clock.seconds_by_op["add"], 3 * (d.kernel_seconds + bytes_each))
    assert set(clock.seconds_by_op) == {"mm", "add"}
    with emulate.emulated("h100-node") as clock:     # eager: waits for launches, not counted
        for _ in range(100):
            x = x + 1
    assert clock.launch_waits
    _close(sum(clock.seconds_by_op.values()),
           clock.now() - sum(b - a for a, b in clock.launch_waits))
    w = torch.nn.Parameter(torch.randn(8, 8))
    opt = torch.optim.AdamW([w], fused=False, foreach=True)
    w.grad = torch.randn(8, 8)
    with emulate.emulated("h100-node", launch="graphs") as clock:
        opt.step()
    assert set(clock.seconds_by_op) == {"optimizer step"}
    _close(clock.seconds_by_op["optimizer step"], clock.now())


def test_kernel_time_sums_in_four_kinds():
    """``seconds_by_kind``: matmuls, attention, the optimizer step and the rest, each kernel
    counted once."""
    q = torch.randn(1, 2, 16, 8)
    w = torch.nn.Parameter(torch.randn(8, 8))
    opt = torch.optim.AdamW([w], fused=False, foreach=True)
    with emulate.emulated("h100-node", launch="graphs") as clock:
        y = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        (y @ w).relu().sum().backward()
        opt.step()
    kinds = emulate.seconds_by_kind(clock.seconds_by_op)
    assert list(kinds) == ["matmuls", "attention", "optimizer step", "element-wise and copies"]
    assert all(v > 0 for v in kinds.values())
    _close(sum(kinds.values()), sum(clock.seconds_by_op.values()))
    assert kinds["optimizer step"] == clock.seconds_by_op["optimizer step"]
    matmuls = sum(v for op, v in clock.seconds_by_op.items() if op in ("mm", "bmm"))
    assert kinds["matmuls"] == matmuls
    assert emulate.seconds_by_kind({}) == dict.fromkeys(kinds, 0.0)
