"""The published GPU trace (ResNet-50 under DDP on 2 A100s, rank 0) read by the course's tools."""
import gzip
import json

import pytest

from lecture_lib import profiling
from lecture_lib.profiling import published

RESNET50_PARAMS = 25_557_032        # torchvision's resnet50: its weights' "num_params"


@pytest.fixture(scope="module")
def trace():
    return published.resnet50_ddp()


@pytest.fixture(scope="module")
def raw():
    with gzip.open(published.RESNET50_DDP, "rt") as f:
        return json.load(f)["traceEvents"]


def _union(intervals, lo, hi):
    """Length of the union of intervals clipped to [lo, hi], by sweeping sorted starts."""
    total, end = 0.0, lo
    for s, e in sorted(intervals):
        s, e = max(s, end), min(e, hi)
        if e > s:
            total, end = total + e - s, e
    return total


def test_the_trace_holds_three_steps_of_all_reduces_and_broadcasts(trace):
    p = trace.profile
    assert len(p.steps) == 3 and p.comm_kinds == {"all_reduce", "broadcast"}
    assert all(e.device for e in p.events)            # the excerpt keeps the GPU's events only


def test_each_step_all_reduces_every_gradient_once_in_five_buckets(trace):
    for s, e in trace.profile.steps:
        reduces = [c for c in trace.collectives if c["kind"] == "allreduce" and s <= c["start"] < e]
        assert len(reduces) == 5
        assert sum(c["elements"] for c in reduces) == RESNET50_PARAMS


def test_the_first_all_reduce_starts_during_the_hosts_backward(trace):
    for s, e in trace.profile.steps:
        backward = [(a, b) for k, a, b in trace.phases if k == "backward" and s <= a < e]
        assert len(backward) == 1
        first = min(c["start"] for c in trace.collectives
                    if c["kind"] == "allreduce" and s <= c["start"] < e)
        assert backward[0][0] < first < backward[0][1]


def test_the_shares_equal_a_direct_reading_of_the_raw_events(trace, raw):
    t0 = min(r["ts"] for r in raw if r["name"].startswith("ProfilerStep#"))
    kernels = [((r["ts"] - t0) * 1e-6, (r["ts"] + r["dur"] - t0) * 1e-6,
                "nccl" in r["name"].lower())
               for r in raw if r["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    p = trace.profile
    span = sum(e - s for s, e in p.steps)
    busy = sum(_union([(a, b) for a, b, nccl in kernels if not nccl], s, e) for s, e in p.steps)
    comm = sum(_union([(a, b) for a, b, nccl in kernels if nccl], s, e) for s, e in p.steps)
    assert p.busy_share == pytest.approx(busy / span, rel=1e-9)
    assert p.comm_share == pytest.approx(comm / span, rel=1e-9)


def test_the_gpu_computes_a_fifth_of_the_step_and_waits_for_the_host_most_of_the_rest(trace):
    p = trace.profile
    exposed = profiling.exposed_share(p)
    assert 0.15 < p.busy_share < 0.2 and 0 < exposed < p.comm_share < 0.1
    verdict = profiling.diagnose(exposed, p.busy_share, comm_kinds=p.comm_kinds, overlapped=True)
    assert verdict.underused and not verdict.comm_bound


def test_the_phases_are_the_hosts_forward_backward_and_optimizer_in_order(trace):
    assert [k for k, _, _ in trace.phases] == ["forward", "backward", "optimizer"] * 3
    assert all(a < b for _, a, b in trace.phases)
    assert all(b1 <= a2 for (_, _, b1), (_, a2, _) in zip(trace.phases, trace.phases[1:]))
