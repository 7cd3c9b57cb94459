"""lecture_lib.collectives: ring collectives from send/recv, equal to torch's, on any group;
lecture_lib.bandwidth: the benchmark that times them."""
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import bandwidth as B
from lecture_lib import collectives as C

SIZES = (1, 5, 7, 13, 64)          # fewer elements than ranks, not divisible, divisible
COLLECTIVES = ("all_reduce", "reduce", "all_gather", "broadcast", "reduce_scatter",
               "all_to_all", "gather", "scatter", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_gather_single", "reduce_scatter_single")


@contextmanager
def _no_collectives():
    """Make every torch collective raise, on this rank, inside the block (then restore:
    the warm worker process serves later calls)."""
    def forbidden(*args, **kwargs):
        raise AssertionError("built from send/recv only: no collective allowed")
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    try:
        for name in saved:
            setattr(dist, name, forbidden)
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _data(n, rank, dtype=torch.float32):
    return (torch.arange(n, dtype=dtype) * 3 + 100 * rank + 1).to(lecture_lib.device())


def _everything_on_rank(group_ranks=None):
    """Every collective on every size; returns what it got and what torch's give."""
    group = None
    if group_ranks is not None:            # every rank creates every group, uses its own
        groups = [dist.new_group(r) for r in group_ranks]
        group = next(g for g, r in zip(groups, group_ranks) if dist.get_rank() in r)
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    expected = {}
    for n in SIZES:
        t = _data(n, rank)
        dist.all_reduce(t, group=group)
        expected[n] = t
    gathered_ref = torch.empty(p * 2, 3)
    dist.all_gather_into_tensor(gathered_ref, torch.full((2, 3), float(rank)), group=group)
    with _no_collectives():
        out = {}
        for n in SIZES:
            x = _data(n, rank)
            before = x.clone()
            out[("ring_sum", n)] = C.ring_all_reduce(x.clone(), group=group)
            out[("ring_avg", n)] = C.ring_all_reduce(x.clone(), "avg", group=group)
            out[("naive_sum", n)] = C.naive_all_reduce(x.clone(), group=group, root=p - 1)
            out[("naive_avg", n)] = C.naive_all_reduce(x.clone(), "avg", group=group)
            out[("rs_sum", n)] = C.ring_reduce_scatter(x, group=group)
            out[("rs_avg", n)] = C.ring_reduce_scatter(x, "avg", group=group)
            out[("unchanged", n)] = torch.equal(x, before)
        out["non_contiguous"] = C.ring_all_reduce(_data(12, rank).view(3, 4).t(), group=group)
        out["gather"] = C.ring_all_gather(torch.full((2, 3), float(rank)), group=group)
        out["a2a"] = C.all_to_all([torch.full((2,), 10.0 * rank + j) for j in range(p)],
                                  group=group)
    return {"got": out, "all_reduce": expected, "all_gather": gathered_ref, "rank": rank, "p": p}


def _check(result):
    got, rank, p = result["got"], result["rank"], result["p"]
    for n in SIZES:
        total = result["all_reduce"][n]
        mine = total.split(C.chunk_sizes(n, p))[rank]
        torch.testing.assert_close(got[("ring_sum", n)], total, rtol=0, atol=0)
        torch.testing.assert_close(got[("ring_avg", n)], total / p)
        torch.testing.assert_close(got[("naive_sum", n)], total, rtol=0, atol=0)
        torch.testing.assert_close(got[("naive_avg", n)], total / p)
        torch.testing.assert_close(got[("rs_sum", n)], mine, rtol=0, atol=0)
        torch.testing.assert_close(got[("rs_avg", n)], mine / p)
        assert got[("unchanged", n)], "ring_reduce_scatter modified its input"
    assert got["non_contiguous"].shape == (4, 3)
    torch.testing.assert_close(got["gather"], result["all_gather"], rtol=0, atol=0)
    assert [t.tolist() for t in got["a2a"]] == [[10.0 * j + rank] * 2 for j in range(p)]


def test_equal_to_torch_on_subgroups():
    results = lecture_lib.run(_everything_on_rank, 5, [[0, 2, 4], [1, 3]], timeout=120)
    assert [r["p"] for r in results] == [3, 2, 3, 2, 3]
    for result in results:
        _check(result)


@pytest.mark.parametrize("world_size", [5, 8, 4, 3, 2, 1])  # this order reuses warm pools
def test_equal_to_torch_on_the_default_group(world_size):
    for result in lecture_lib.run(_everything_on_rank, world_size, timeout=120):
        _check(result)


def test_chunk_sizes():
    assert C.chunk_sizes(7, 3) == [3, 2, 2]
    assert C.chunk_sizes(2, 4) == [1, 1, 0, 0]
    assert sum(C.chunk_sizes(1001, 8)) == 1001


def _bad_inputs_on_rank():
    errors = {}
    group = dist.new_group([1, 2])
    cases = {
        "wrong device": lambda: C.ring_all_reduce(torch.ones(4, device="meta")),
        "not in group": lambda: C.ring_all_reduce(torch.ones(4), group=group),
        "bad op": lambda: C.ring_all_reduce(torch.ones(4), op="max"),
        "avg of ints": lambda: C.ring_reduce_scatter(torch.ones(4, dtype=torch.long), "avg"),
        "not a tensor": lambda: C.ring_all_gather([1, 2]),
        "a2a count": lambda: C.all_to_all([torch.ones(2)]),
        "bad root": lambda: C.naive_all_reduce(torch.ones(2), root=7),
    }
    for name, call in cases.items():
        if name == "not in group" and dist.get_rank() != 0:
            continue
        try:
            call()
        except (ValueError, TypeError) as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    return errors


def test_bad_input_is_a_clear_error():
    errors = lecture_lib.run(_bad_inputs_on_rank, 3, timeout=60)[0]
    assert "device" in errors["wrong device"] and "ValueError" in errors["wrong device"]
    assert "not a member of the group" in errors["not in group"]
    assert "op must be" in errors["bad op"]
    assert "floating-point" in errors["avg of ints"]
    assert errors.keys() == {"wrong device", "not in group", "bad op", "avg of ints",
                             "not a tensor", "a2a count", "bad root"}


def test_bandwidth_sweep_arguments_are_checked():
    with pytest.raises(ValueError, match="kind must be"):       # before any process starts
        B.bandwidth_sweep([1024], kinds=("broadcast",))
    with pytest.raises(ValueError, match="repeats"):
        B.bandwidth_sweep([1024], repeats=0)
    with pytest.raises(ValueError, match="naive"):
        B.bandwidth_sweep([1024], kinds=("all_gather",), impls=("naive",))


def _sweep_on_rank():
    return B.bandwidth_sweep([4096, 1 << 18], impls=("torch", "ring"), repeats=2)


def test_bandwidth_sweep_reports_nccl_tests_definitions_and_fits():
    rows = lecture_lib.run(_sweep_on_rank, 4, timeout=120)[0]
    assert len(rows) == 3 * 2 * 2
    for row in rows:
        assert row["world_size"] == 4 and row["seconds"] > 0
        assert row["bytes"] % 16 == 0                  # whole float32 elements per rank
        assert row["algbw"] == pytest.approx(row["bytes"] / row["seconds"])
        factor = 2 * 3 / 4 if row["kind"] == "all_reduce" else 3 / 4
        assert row["busbw"] == pytest.approx(row["algbw"] * factor)
    assert {(r["kind"], r["impl"]) for r in rows} == {(k, i) for k in B.KINDS
                                                       for i in ("torch", "ring")}


def test_measure_bandwidth_checks_first_then_gives_the_sweeps_rows_in_its_order():
    with pytest.raises(ValueError, match="kind must be"):       # before any process starts
        B.measure_bandwidth(2, [1024], kinds=("broadcast",))
    rows = B.measure_bandwidth(2, [4096, 1 << 12], ("all_reduce", "all_gather"), ("torch",),
                               repeats=1, timeout=120)
    assert [(r["kind"], r["impl"], r["world_size"]) for r in rows] == (
        [("all_reduce", "torch", 2)] * 2 + [("all_gather", "torch", 2)] * 2)
    assert all(r["seconds"] > 0 and r["bytes"] == 4096 for r in rows)


def test_fit_sweep_recovers_alpha_and_beta_per_collective():
    truth = {("all_reduce", "ring", 4): (2e-3, 1e8), ("all_gather", "torch", 2): (5e-4, 3e8)}
    rows = [{"kind": k, "impl": i, "world_size": p, "bytes": n, "seconds": a + n / b}
            for (k, i, p), (a, b) in truth.items() for n in (1024, 1 << 16, 1 << 22)]
    fits = B.fit_sweep(rows)
    assert fits.keys() == truth.keys()
    for key, (alpha, beta) in truth.items():
        assert fits[key] == pytest.approx((alpha, beta), rel=1e-6)
