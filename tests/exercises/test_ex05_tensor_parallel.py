"""ex05: f, g, ColumnParallelLinear and RowParallelLinear, each against the one-device
nn.Linear (rtol 1e-5): forward, input gradient, weight gradients, and the collectives
they run (f: none forward, one all-reduce backward; g: the reverse)."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import lecture_lib
from lecture_lib.grading import load_exercise
from lecture_lib.tensor_parallel import seeded_linear

ex = load_exercise("ex05")
POINTS = 10
RTOL, ATOL = 1e-5, 1e-6


def _count_all_reduces():
    """Wrap dist.all_reduce on this rank (its process ends with the call) to count calls."""
    calls = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return real(tensor, *args, **kwargs)
    dist.all_reduce = counting
    return calls


def _column_on_rank():
    r, p = dist.get_rank(), dist.get_world_size()
    calls = _count_all_reduces()
    full = seeded_linear(8, 12, seed=1)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(2))
    w = torch.randn(5, 12, generator=torch.Generator().manual_seed(3))
    x_ref = x.clone().requires_grad_(True)
    y_ref = full(x_ref)
    (y_ref * w).sum().backward()
    layer = ex.ColumnParallelLinear(full)
    xi = x.clone().requires_grad_(True)
    y = layer(xi)
    forward_calls = len(calls)
    (y * w.chunk(p, 1)[r]).sum().backward()
    return {"y": (y.detach(), y_ref.detach().chunk(p, 1)[r]),
            "x grad": (xi.grad, x_ref.grad),
            "w grad": (layer.weight.grad, full.weight.grad.chunk(p, 0)[r]),
            "b grad": (layer.bias.grad, full.bias.grad.chunk(p, 0)[r]),
            "calls": (forward_calls, len(calls) - forward_calls)}


def _row_on_rank():
    r, p = dist.get_rank(), dist.get_world_size()
    calls = _count_all_reduces()
    full = seeded_linear(12, 8, seed=4)
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(5))
    w = torch.randn(5, 8, generator=torch.Generator().manual_seed(6))
    x_ref = x.clone().requires_grad_(True)
    y_ref = full(x_ref)
    (y_ref * w).sum().backward()
    layer = ex.RowParallelLinear(full)
    xi = x.chunk(p, 1)[r].clone().requires_grad_(True)
    y = layer(xi)
    forward_calls = len(calls)
    (y * w).sum().backward()
    return {"y": (y.detach(), y_ref.detach()),
            "x grad": (xi.grad, x_ref.grad.chunk(p, 1)[r]),
            "w grad": (layer.weight.grad, full.weight.grad.chunk(p, 1)[r]),
            "b grad": (layer.bias.grad, full.bias.grad),
            "calls": (forward_calls, len(calls) - forward_calls)}


def _mlp_on_rank():
    """Megatron's MLP: column, GELU, row; one all-reduce forward, one backward."""
    calls = _count_all_reduces()
    fc1, fc2 = seeded_linear(8, 16, seed=7), seeded_linear(16, 8, seed=8)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(9))
    x_ref = x.clone().requires_grad_(True)
    y_ref = fc2(F.gelu(fc1(x_ref)))
    y_ref.pow(2).sum().backward()
    col, row = ex.ColumnParallelLinear(fc1), ex.RowParallelLinear(fc2)
    xi = x.clone().requires_grad_(True)
    y = row(F.gelu(col(xi)))
    forward_calls = len(calls)
    y.pow(2).sum().backward()
    return {"y": (y.detach(), y_ref.detach()), "x grad": (xi.grad, x_ref.grad),
            "calls": (forward_calls, len(calls) - forward_calls)}


def _check_calls(results, expected, what):
    """Each rank ran ``expected`` = (forward, backward) all-reduces."""
    for rank, res in enumerate(results):
        assert res["calls"] == expected, (
            f"rank {rank}: {what} should run {expected[0]} all-reduce(s) forward and "
            f"{expected[1]} backward; got {res['calls'][0]} forward, {res['calls'][1]} backward")


def _check(results, what):
    for rank, res in enumerate(results):
        got, expected = res[what]
        assert got is not None, f"rank {rank}: no {what} (did the gradient reach it?)"
        assert got.shape == expected.shape, (f"rank {rank} {what}: expected shape "
                                             f"{tuple(expected.shape)}, got {tuple(got.shape)}")
        torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL,
                                   msg=lambda m, rank=rank, what=what: f"rank {rank} {what}: {m}")


@pytest.mark.parametrize("world_size", [2, 4])
def test_column_parallel_forward_gives_this_ranks_columns(world_size):
    _check(ex.run(_column_on_rank, world_size, timeout=60), "y")


@pytest.mark.parametrize("world_size", [2, 4])
def test_column_parallel_backward_all_reduces_the_input_gradient(world_size):
    results = ex.run(_column_on_rank, world_size, timeout=60)
    for what in ("x grad", "w grad", "b grad"):
        _check(results, what)
    _check_calls(results, (0, 1), "ColumnParallelLinear (f: identity forward)")


@pytest.mark.parametrize("world_size", [2, 4])
def test_row_parallel_forward_sums_the_partial_products(world_size):
    _check(ex.run(_row_on_rank, world_size, timeout=60), "y")


@pytest.mark.parametrize("world_size", [2, 4])
def test_row_parallel_backward_is_local(world_size):
    results = ex.run(_row_on_rank, world_size, timeout=60)
    for what in ("x grad", "w grad", "b grad"):
        _check(results, what)
    _check_calls(results, (1, 0), "RowParallelLinear (g: identity backward)")


def test_megatron_mlp_equals_one_device_with_one_all_reduce_each_way():
    results = ex.run(_mlp_on_rank, 2, timeout=60)
    _check(results, "y")
    _check(results, "x grad")
    _check_calls(results, (1, 1), "column -> GELU -> row")


def _operators_on_rank():
    """f and g on their own, where autograd still needs what it hands them: g between two
    tanh (the first saves its output, g's input; the second follows g), and f followed by a
    sum (whose backward hands f an expanded view of one number)."""
    r = dist.get_rank()
    a = torch.randn(3, 4, generator=torch.Generator().manual_seed(20 + r)).requires_grad_()
    w = torch.randn(3, 4, generator=torch.Generator().manual_seed(30))
    t = torch.tanh(a)
    before = t.detach().clone()
    z = torch.tanh(ex.ReduceFromTensorParallel.apply(t))
    (z * w).sum().backward()
    b = torch.randn(5, generator=torch.Generator().manual_seed(40 + r)).requires_grad_()
    ex.CopyToTensorParallel.apply(b).sum().backward()
    return {"z": z.detach(), "a grad": a.grad, "b grad": b.grad,
            "g input kept": torch.equal(t.detach(), before)}


def test_f_and_g_leave_the_tensors_autograd_hands_them_alone():
    p = 2
    try:
        results = ex.run(_operators_on_rank, p, timeout=60)
    except lecture_lib.RankError as exc:
        raise AssertionError(
            "f or g failed where autograd hands them a tensor it still needs, or a view it "
            "cannot write (tanh(g(tanh(a))), f(b).sum()): a collective works in place, so "
            "all-reduce a copy (x.clone(), grad.clone()), never the tensor you were given\n"
            + str(exc)) from None
    tanh_a = [torch.tanh(torch.randn(3, 4, generator=torch.Generator().manual_seed(20 + r)))
              for r in range(p)]
    w = torch.randn(3, 4, generator=torch.Generator().manual_seed(30))
    z = torch.tanh(sum(tanh_a))
    for rank, res in enumerate(results):
        assert res["g input kept"], (
            f"rank {rank}: g changed its input x (the output of a tanh, which autograd saved "
            "for tanh's backward): all-reduce a copy of x, not x itself")
        torch.testing.assert_close(res["z"], z, rtol=RTOL, atol=ATOL, msg=lambda m, rank=rank:
                                   f"rank {rank}: tanh(g(tanh(a))) forward: {m}")
        want = w * (1 - z ** 2) * (1 - tanh_a[rank] ** 2)
        torch.testing.assert_close(res["a grad"], want, rtol=RTOL, atol=ATOL,
                                   msg=lambda m, rank=rank: f"rank {rank}: the gradient of a "
                                   f"through tanh(g(tanh(a))) (is g's input left alone?): {m}")
        torch.testing.assert_close(res["b grad"], torch.full((5,), float(p)), msg=lambda m,
                                   rank=rank: f"rank {rank}: the gradient of b through "
                                   f"f(b).sum() (every rank's ones, all-reduced): {m}")


def test_uneven_split_is_refused():
    def build():
        ex.ColumnParallelLinear(seeded_linear(4, 8))          # an even split builds
        return ex.ColumnParallelLinear(seeded_linear(4, 6))
    with pytest.raises(lecture_lib.RankError, match="not divisible"):
        ex.run(build, 4, timeout=60)
