"""lecture_lib.emulate: virtual time from the real code (roofline compute, alpha-beta messages).

Every expected time below is computed from the preset's constants and the
textbook formula, never read back from the emulation.
"""
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import emulate
from lecture_lib.costmodel.comm import Link

H100 = emulate.preset("h100-node")
NV, IB = H100.intra, H100.inter
RATE, BW = H100.device.bf16_flops, H100.device.memory_bandwidth


def _matmul_seconds(m, rate=RATE):
    """An m x m x m fp32 matmul on the roofline: max(FLOPs / rate, bytes / bandwidth)."""
    return max(2 * m ** 3 / rate, 3 * 4 * m * m / BW)


def _close(a, b, rel=0.02):
    assert abs(a - b) <= rel * abs(b), (a, b)


# ----------------------------------------------------------------------------
# Compute: the roofline
# ----------------------------------------------------------------------------

def test_matmul_chain_is_flops_over_rate():
    # 1024-square fp32 matmuls charged at TF32 (494 TFLOP/s): 2n^3 / 12n^2 = 171 FLOP/byte,
    # above the ridge 494/3.35 = 147: compute-bound, so the time is FLOPs / rate.
    a, b, c = (torch.randn(1024, 1024) for _ in range(3))
    with emulate.emulated("h100-node", fp32="tf32") as clock:
        (a @ b) @ c
    flops = 2 * 2 * 1024 ** 3
    _close(clock.now(), flops / H100.device.tf32_flops)
    assert clock.flops == flops


def test_a_thin_matmul_is_memory_bound():
    # 512x1024 @ 1024x2048 at the bf16 rate: 2.1 GFLOP is 2.2 us, 14.7 MB is 4.4 us.
    a, b = torch.randn(512, 1024), torch.randn(1024, 2048)
    with emulate.emulated("h100-node") as clock:
        a @ b
    _close(clock.now(), 4 * (512 * 1024 + 1024 * 2048 + 512 * 2048) / BW)


def test_fp32_option_picks_the_rate():
    a = torch.randn(1024, 1024)
    with emulate.emulated("h100-node", fp32="fp32") as clock:
        a @ a
    _close(clock.now(), 2 * 1024 ** 3 / H100.device.fp32_flops)


def test_elementwise_op_is_charged_by_bytes():
    x, y = torch.randn(1 << 20), torch.randn(1 << 20)
    with emulate.emulated("h100-node") as clock:
        x + y
        x.view(1024, 1024).t()                  # views move nothing
    _close(clock.now(), 3 * 4 * (1 << 20) / BW)
    assert clock.flops == 0


def test_outside_the_block_nothing_is_charged_and_functions_are_restored():
    original = dist.all_reduce
    with emulate.emulated("h100-node") as clock:
        assert dist.all_reduce is not original
    assert dist.all_reduce is original and emulate.current() is None
    torch.randn(64, 64) @ torch.randn(64, 64)
    assert clock.now() == 0.0


# ----------------------------------------------------------------------------
# Communication: collectives, overlap, messages (on real ranks)
# ----------------------------------------------------------------------------

def _all_reduce(n):
    x = torch.ones(n // 4)
    with emulate.emulated("h100-node") as clock:
        dist.all_reduce(x)
    return clock.now(), x[0].item()


def _async_overlap(n, m):
    x, a = torch.ones(n // 4), torch.randn(m, m)
    with emulate.emulated("h100-node", fp32="fp32") as clock:    # 67 TFLOP/s
        work = dist.all_reduce(x, async_op=True)
        a @ a
        t_issue = clock.now()
        work.wait()
    return t_issue, clock.now()


def _send_recv(n, m):
    x, a = torch.arange(n // 4, dtype=torch.float32), torch.randn(m, m)
    with emulate.emulated("h100-ib") as clock:
        if dist.get_rank() == 0:
            a @ a                               # the sender is late by one matmul
            dist.send(x, 1)
        else:
            dist.recv(x, 0)
    return clock.now(), x[-1].item()


def test_collectives_and_messages_on_four_ranks():
    n, m, p = 1 << 20, 1024, 4
    ring = 2 * (p - 1) * NV.alpha + 2 * (p - 1) / p * n / NV.beta
    for t, value in lecture_lib.run(_all_reduce, p, n, timeout=120):
        _close(t, ring)
        assert value == p
    matmul = _matmul_seconds(m, H100.device.fp32_flops)       # 32 us, longer than the ring
    assert matmul > ring
    for t_issue, t_end in lecture_lib.run(_async_overlap, p, n, m, timeout=120):
        _close(t_issue, matmul)                 # the matmul did not wait for the network
        _close(t_end, max(ring, matmul))
    matmul = _matmul_seconds(m)
    (t0, _), (t1, last) = lecture_lib.run(_send_recv, 2, n, m, timeout=120)
    _close(t0, matmul + IB.alpha + n / IB.beta)
    _close(t1, matmul + IB.alpha + n / IB.beta)  # arrival = sender's time + message
    assert last == n // 4 - 1
