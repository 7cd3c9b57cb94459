"""lecture_lib.emulate's calibrated charges: kernels, launches, waves, attention, optimizers, NCCL.

Each expected value is computed from the preset's constants and the model's
formula (lecture_lib/emulate/compute.py, nccl.py), never read back from a run.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import lecture_lib
from lecture_lib import emulate
from lecture_lib.emulate import nccl

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
    _close(clock.now(), d.kernel_seconds + 2 * 1024 ** 3 / rate)


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
    _close(seconds, D.kernel_seconds + max(flops / rate, nbytes / bandwidth))
    # a short k cannot be split: 4 tiles of 132 SMs busy
    a, b = a[:, :256], b[:256]
    seconds, flops, _ = emulate.op_cost(torch.ops.aten.mm.default, (a, b), {}, a @ b, H100)
    _close(seconds, D.kernel_seconds + flops / (rate * 4 / 132))
