"""lecture_lib.emulate: virtual time from the real code (the roofline charges, alpha-beta rings).

Every expected time below is computed from the preset's constants and the
textbook formula, never read back from the emulation.
"""
import importlib
import json
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import data_parallel as DP
from lecture_lib import emulate, metrics
from lecture_lib import tensor_parallel as TP
from lecture_lib.costmodel.comm import Link
from lecture_lib.dims import ParallelDims, Recipe
from lecture_lib.emulate.session import user_code
from lecture_lib.expert_parallel import MoEConfig
from lecture_lib.expert_parallel.experiments import train_moe
from lecture_lib.figures import plots
from lecture_lib.hybrid import train_on_rank
from lecture_lib.models import GPT, GPTConfig, MarkovText, lm_loss, shard
from lecture_lib.pipeline import make_schedule
from lecture_lib.pipeline.experiments import train_stage
from lecture_lib.zero import FullyShardedModel, fsdp_gather_full_params

# The idealised charges: datasheet peaks and alpha-beta rings (the calibrated charges are
# tested in tests/test_emulate_calibrated.py).
H100 = emulate.preset("h100-node", charges="roofline")
H100_IB = emulate.preset("h100-ib", charges="roofline")
NV, IB = H100.intra, H100.inter
RATE, BW = H100.device.bf16_flops, H100.device.memory_bandwidth


def _matmul_seconds(m, rate=RATE):
    """An m x m x m fp32 matmul on the roofline: max(FLOPs / rate, bytes / bandwidth); at the
    bf16 rate its operands move as bf16 (as if mixed precision), else as fp32."""
    return max(2 * m ** 3 / rate, 3 * (2 if rate == RATE else 4) * m * m / BW)


def _close(a, b, rel=0.02):
    assert abs(a - b) <= rel * abs(b), (a, b)


# ----------------------------------------------------------------------------
# Compute: the roofline
# ----------------------------------------------------------------------------

def test_matmul_chain_is_flops_over_rate():
    # 1024-square fp32 matmuls charged at TF32 (494 TFLOP/s): 2n^3 / 12n^2 = 171 FLOP/byte,
    # above the ridge 494/3.35 = 147: compute-bound, so the time is FLOPs / rate.
    a, b, c = (torch.randn(1024, 1024) for _ in range(3))
    with emulate.emulated(H100, fp32="tf32") as clock:
        (a @ b) @ c
    flops = 2 * 2 * 1024 ** 3
    _close(clock.now(), flops / H100.device.tf32_flops)
    assert clock.flops == flops


def test_a_thin_matmul_is_memory_bound():
    # 128x1024 @ 1024x2048 at the bf16 rate, its fp32 operands moved as bf16 ("as if mixed
    # precision"): 0.54 GFLOP is 0.54 us, 2 * 2.4 M elements = 5.0 MB is 1.5 us.
    a, b = torch.randn(128, 1024), torch.randn(1024, 2048)
    with emulate.emulated(H100) as clock:
        a @ b
    _close(clock.now(), 2 * (128 * 1024 + 1024 * 2048 + 128 * 2048) / BW)


def test_fp32_bytes_are_real_when_fp32_is_charged_as_fp32():
    a, b = torch.randn(128, 1024), torch.randn(1024, 2048)
    with emulate.emulated(H100, fp32="tf32") as clock:
        a @ b
    _close(clock.now(), 4 * (128 * 1024 + 1024 * 2048 + 128 * 2048) / BW)


def test_fp32_option_picks_the_rate():
    a = torch.randn(1024, 1024)
    with emulate.emulated(H100, fp32="fp32") as clock:
        a @ a
    _close(clock.now(), 2 * 1024 ** 3 / H100.device.fp32_flops)


def test_elementwise_op_is_charged_by_bytes():
    x, y = torch.randn(1 << 20), torch.randn(1 << 20)
    with emulate.emulated(H100) as clock:
        x + y
        x.view(1024, 1024).t()                  # views move nothing
    _close(clock.now(), 3 * 2 * (1 << 20) / BW)          # fp32 moved as bf16
    assert clock.flops == 0


def test_outside_the_block_nothing_is_charged_and_functions_are_restored():
    original = dist.all_reduce
    with emulate.emulated(H100) as clock:
        assert dist.all_reduce is not original
    assert dist.all_reduce is original and emulate.current() is None
    torch.randn(64, 64) @ torch.randn(64, 64)
    assert clock.now() == 0.0


# ----------------------------------------------------------------------------
# Communication: collectives, overlap, messages (on real ranks)
# ----------------------------------------------------------------------------

def _all_reduce(n):
    x = torch.ones(n // 4)
    with emulate.emulated(H100) as clock:
        dist.all_reduce(x)
    return clock.now(), x[0].item()


def _async_overlap(n, m):
    x, a = torch.ones(n // 4), torch.randn(m, m)
    with emulate.emulated(H100, fp32="fp32") as clock:    # 67 TFLOP/s
        work = dist.all_reduce(x, async_op=True)
        a @ a
        t_issue = clock.now()
        work.wait()
    return t_issue, clock.now(), clock.issued


def _send_recv(n, m):
    x, a = torch.arange(n // 4, dtype=torch.float32), torch.randn(m, m)
    with emulate.emulated(H100_IB) as clock:
        if dist.get_rank() == 0:
            a @ a                               # the sender is late by one matmul
            dist.send(x, 1)
        else:
            dist.recv(x, 0)
    return clock.now(), x[-1].item()


def _plain_all_reduce(n):
    x = torch.ones(n // 4)
    dist.all_reduce(x)
    return x[0].item()


def test_collectives_and_messages_on_four_ranks():
    n, m, p = 1 << 20, 1024, 4
    ring = 2 * (p - 1) * NV.alpha + 2 * (p - 1) / p * n / NV.beta
    for t, value in lecture_lib.run(_all_reduce, p, n, timeout=120):
        _close(t, ring)
        assert value == p
    for out in emulate.run(_plain_all_reduce, p, n, preset=H100, timeout=120):
        assert out.result == p
        _close(out.clock.now(), ring)
        assert out.clock.calls_by_kind == {"all_reduce": 1}
    matmul = _matmul_seconds(m, H100.device.fp32_flops)       # 32 us, longer than the ring
    assert matmul > ring
    for t_issue, t_end, issued in lecture_lib.run(_async_overlap, p, n, m, timeout=120):
        _close(t_issue, matmul)                 # the matmul did not wait for the network
        _close(t_end, max(ring, matmul))
        assert issued == [("all_reduce", 0.0, n)]   # issued with its data ready at 0
    matmul = _matmul_seconds(m)
    (t0, _), (t1, last) = lecture_lib.run(_send_recv, 2, n, m, timeout=120)
    _close(t0, matmul + IB.alpha + n / IB.beta)
    _close(t1, matmul + IB.alpha + n / IB.beta)  # arrival = sender's time + message
    assert last == n // 4 - 1


_USER_MODULE = '''"""A student's own module, under a name the course never uses."""
import torch
from torch.distributed import all_reduce


def total(n):
    x = torch.ones(n)
    all_reduce(x)
    return x[0].item()
'''


def _in_a_user_module(folder, name):
    """On a rank: import module ``name`` from ``folder`` and run its all-reduce emulated."""
    sys.path.insert(0, folder)
    try:
        module = importlib.import_module(name)
        with emulate.emulated(H100) as clock:
            value = module.total(1024)
        return value, clock.calls_by_kind
    finally:
        sys.path.remove(folder)
        sys.modules.pop(name, None)


def test_a_user_module_of_any_name_is_timed(tmp_path):
    """A module's own reference to a collective (``from torch.distributed import all_reduce``)
    is timed whatever the module is called (not only in solutions/, exercises/, examples/);
    the standard library's and installed packages' modules are left alone."""
    name = "my_ring_homework"
    (tmp_path / f"{name}.py").write_text(_USER_MODULE)
    for value, calls in lecture_lib.run(_in_a_user_module, 2, str(tmp_path), name, timeout=120):
        assert value == 2 and calls == {"all_reduce": 1}
    assert not any(user_code(m.__name__, m) for m in (torch, dist, json, pytest))


# ----------------------------------------------------------------------------
# Results untouched: every scheme, with and without the emulation, bit for bit
# ----------------------------------------------------------------------------

CFG = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=2, n_layers=2)
DATA = MarkovText(CFG.vocab_size, CFG.seq_len, seed=1)


def _ddp(variant):
    model = GPT(CFG, seed=0)
    wrapped = {"flat": lambda m: DP.DDPFlat(m),
               "individual": lambda m: DP.DDPIndividualParameters(m),
               "bucketed": lambda m: DP.DDPBucketed(m, bucket_size_mb=0.01)}[variant](model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(2):
        x, y = shard(DATA.batch(step, 8), dist.get_rank(), dist.get_world_size())
        opt.zero_grad(set_to_none=True)
        wrapped.on_train_batch_start()
        loss = lm_loss(wrapped(x), y)
        loss.backward()
        wrapped.finish_gradient_synchronization()
        opt.step()
        losses.append(loss.detach())
    return losses + [p.detach().clone() for p in model.parameters()]


def _tensor_parallel():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 16)                       # the same input on every rank
    col = TP.ColumnParallelLinear(16, 32, seed=1)
    row = TP.RowParallelLinear(32, 16, seed=2)
    out = row(torch.relu(col(x)))
    out.square().mean().backward()
    return [out.detach()] + [p.grad.clone() for p in (col.weight, col.bias, row.weight)]


def _zero3():
    model = FullyShardedModel(GPT(CFG, seed=0))
    opt = torch.optim.SGD(model.shard_parameters(), lr=0.5)
    out = []
    for step in range(2):
        x, y = shard(DATA.batch(step, 8), dist.get_rank(), dist.get_world_size())
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.detach())
    return out + list(fsdp_gather_full_params(model).values())


def _pipeline():
    result = train_stage(make_schedule("1f1b", 2, 4), CFG, 8, steps=2)
    return result["losses"] + list(result["grads"].values()) + list(result["params"].values())


def _expert_parallel():
    result = train_moe(CFG, MoEConfig(num_experts=4), steps=2, batch_size=8)
    return result.losses + list(result.params.values())


def _hybrid():
    result = train_on_rank(CFG, ParallelDims(tp=2, pp=2), Recipe(microbatches=2), 8, steps=2)
    return result["losses"] + list(result["params"].values())


SCHEMES = {"ddp flat": lambda: _ddp("flat"), "ddp individual": lambda: _ddp("individual"),
           "ddp bucketed": lambda: _ddp("bucketed"), "tensor parallel": _tensor_parallel,
           "zero-3": _zero3, "pipeline 1f1b": _pipeline, "expert parallel": _expert_parallel}


def _same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def _with_and_without(schemes):
    out = {}
    for name, fn in schemes.items():
        plain = fn()
        with emulate.emulated("h100-node") as clock:        # the calibrated charges
            emulated = fn()
        out[name] = (all(_same(a, b) for a, b in zip(plain, emulated, strict=True)),
                     clock.now(), clock.comm_bytes)
    return out


def test_results_are_bit_identical_with_and_without_emulation():
    runs = lecture_lib.run(_with_and_without, 2, SCHEMES, timeout=240)
    runs += lecture_lib.run(_with_and_without, 4, {"hybrid tp2 x pp2": _hybrid}, timeout=240)
    for rank_result in runs:
        for name, (same, now, comm_bytes) in rank_result.items():
            assert same, f"{name}: results differ under emulation"
            assert now > 0 and comm_bytes > 0, name      # it did charge compute and messages


# ----------------------------------------------------------------------------
# Virtual time is deterministic: a busy core changes nothing
# ----------------------------------------------------------------------------

def _timeline():
    with emulate.emulated("h100-node") as clock:
        torch.optim.AdamW(GPT(CFG).parameters()).step()        # the fused optimizer's path
        _ddp("bucketed")
        _pipeline()
    return clock.summary()


def test_a_busy_core_does_not_change_the_emulated_timeline():
    idle = lecture_lib.run(_timeline, 2, timeout=120)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = lecture_lib.run(_timeline, 2, timeout=120)
    finally:
        spinner.kill()
        spinner.wait()
    assert len(idle[0]["spans"]) > 20
    assert idle == busy


# ----------------------------------------------------------------------------
# Bad input is refused before any process starts
# ----------------------------------------------------------------------------

def test_bad_presets_and_links_are_refused(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(lecture_lib.runtime.launch, "run", no_launch)
    with pytest.raises(ValueError, match="unknown emulation preset"):
        emulate.run(_all_reduce, 2, 1024, preset="h200-node")
    with pytest.raises(ValueError, match="bandwidth"):
        emulate.Cluster("bad", emulate.H100_SXM, Link("slow", 1e-6, 0.0), IB)
    with pytest.raises(ValueError, match="bandwidth"):
        emulate.run(_all_reduce, 2, 1024,
                    preset=emulate.preset("h100-node", inter=Link("neg", 1e-6, -5.0)))
    with pytest.raises(ValueError, match="latency"):
        emulate.preset("a100-node", intra=Link("neg", -1.0, 1e9))
    with pytest.raises(ValueError, match="memory_bandwidth"):
        emulate.Device("bad", 1e12, 1e12, 1e12, memory_bandwidth=0)
    with pytest.raises(ValueError, match="fp32"):
        emulate.preset("h100-node", fp32="fp8")
    with pytest.raises(TypeError):
        emulate.run(_all_reduce, 2, preset=3.0)
    with pytest.raises(RuntimeError, match="already on"):
        with emulate.emulated("h100-node"), emulate.emulated("a100-node"):
            pass
    assert dist.all_reduce.__name__ == "all_reduce" and emulate.current() is None


def test_a_user_defined_device_and_link():
    chip = emulate.Device("toy", bf16_flops=1e12, tf32_flops=1e12, fp32_flops=1e12,
                          memory_bandwidth=1e15)
    with pytest.raises(ValueError, match="calibrated charges need intra_fabric"):
        emulate.Cluster("toy pair", chip, Link("a", 1e-6, 1e9), Link("b", 1e-5, 1e8))
    cluster = emulate.Cluster("toy pair", chip, Link("a", 1e-6, 1e9), Link("b", 1e-5, 1e8),
                              charges="roofline")
    a = torch.randn(256, 256)
    with emulate.emulated(cluster) as clock:
        a @ a
    _close(clock.now(), 2 * 256 ** 3 / 1e12)
    assert cluster.link([0, 1]).name == "a" and cluster.link([7, 8]).name == "b"


# ----------------------------------------------------------------------------
# The library's timers and labels report emulated time while it is on
# ----------------------------------------------------------------------------

def test_timer_wall_time_and_stamp_report_emulated_time():
    a = torch.randn(1024, 1024)
    with emulate.emulated(H100, fp32="tf32") as clock:
        timer = metrics.Timer()
        with timer("compute"), metrics.wall_time() as t:
            a @ a
        assert timer.time_kind == t.time_kind == "emulated H100 + NVLink, roofline"
    expected = 2 * 1024 ** 3 / H100.device.tf32_flops
    _close(timer.totals["compute"], expected)
    _close(t.seconds, expected)
    assert timer.spans[0][1] == 0.0 and clock.now() == timer.spans[0][2]
    assert metrics.time_kind() == "real" and metrics.Timer().time_kind == "real"
    label = plots.machine_label("gloo", 4, emulated="h100-node")
    assert label.startswith("emulated H100 + NVLink, measured from the real code on ")
    assert plots.machine_label("gloo", 4).startswith("measured on ")
    assert plots.machine_label("gloo", 4, kind="counted").startswith("counted on ")
    with pytest.raises(ValueError, match="'measured', 'counted' or 'computed'"):
        plots.machine_label("gloo", 4, kind="timed")


def test_mfu_is_model_flops_over_peak():
    # PaLM appendix B's example shape: 6N + 12 L T d per token.
    per_token = metrics.model_flops_per_token(1_000_000, n_layers=2, seq_len=16, d_model=32)
    assert per_token == 6e6 + 12 * 2 * 16 * 32
    assert metrics.mfu(1000.0, per_token, 1e12, devices=2) == 1000.0 * per_token / 2e12
    with pytest.raises(ValueError):
        metrics.mfu(1.0, per_token, 0.0)
    with pytest.raises(ValueError):
        metrics.model_flops_per_token(-1)
    # the course's GPT (d 64, 4 layers, vocab 64, 32 tokens): a block has 12 d^2 + 13 d
    # parameters, the final norm 2 d, the untied head d V; the embeddings do not count
    d, layers, vocab, seq = 64, 4, 64, 32
    n = layers * (12 * d * d + 13 * d) + 2 * d + d * vocab
    assert metrics.gpt_flops_per_token(GPT(GPTConfig())) == 6 * n + 12 * layers * seq * d


def _timer_keeps_overlap(n, m):
    x, a = torch.ones(n // 4), torch.randn(m, m)
    with emulate.emulated(H100, fp32="fp32") as clock:
        timer = metrics.Timer()
        with timer("compute"):
            work = dist.all_reduce(x, async_op=True)
            a @ a
        with timer("comm"):
            work.wait()
        with metrics.wall_time() as step:
            dist.all_reduce(x, async_op=True).wait()
    return dict(timer.totals), step.seconds, clock.now()


def test_timer_reads_the_compute_stream_so_overlap_stays():
    n, m, p = 1 << 24, 1024, 2
    ring = 2 * (p - 1) * NV.alpha + 2 * (p - 1) / p * n / NV.beta
    matmul = _matmul_seconds(m, H100.device.fp32_flops)
    assert ring > matmul                        # 62 us of all-reduce, 32 us of matmul
    for totals, step, _ in lecture_lib.run(_timer_keeps_overlap, p, n, m, timeout=120):
        _close(totals["compute"], matmul)       # the async all-reduce did not stall compute
        _close(totals["comm"], ring - matmul)   # only the exposed part is "comm"
        _close(step, ring)


def _zero3_bytes():
    model = FullyShardedModel(GPT(CFG, seed=0))
    x, y = shard(DATA.batch(0, 8), dist.get_rank(), dist.get_world_size())
    with emulate.emulated(H100) as clock:
        lm_loss(model(x), y).backward()
    replicated = set(model.replicated_names())
    params = list(model.module.named_parameters())
    psi = 4 * sum(p.numel() for n, p in params if n not in replicated) * dist.get_world_size()
    kept = 4 * sum(p.numel() for n, p in params if n in replicated)
    return psi, kept, clock.bytes_by_kind


def test_zero3_moves_three_psi_measured_from_the_messages():
    for psi, kept, moved in lecture_lib.run(_zero3_bytes, 2, timeout=120):
        # the sharded units (Psi, padded to the ranks): all-gather before forward and again
        # before backward, reduce-scatter after it; parameters outside every unit (the final
        # norm) stay replicated and are all-reduced
        assert moved == {"all_gather": 2 * psi, "reduce_scatter": psi, "all_reduce": kept}


def test_a_copy_reads_its_source_and_writes_its_destination():
    src, dst = torch.randn(1 << 20), torch.empty(1 << 20)
    with emulate.emulated(H100) as clock:
        dst.copy_(src)
    _close(clock.now(), 2 * 2 * (1 << 20) / BW)          # fp32 moved as bf16
