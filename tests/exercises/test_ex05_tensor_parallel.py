"""ex05: f, g, ColumnParallelLinear and RowParallelLinear, each against the one-device
nn.Linear (rtol 1e-5): forward, input gradient, weight gradients, the collectives they run
(every process-group call, whatever its kind: f none forward, one all-reduce backward; g the
reverse) and the tensors each layer holds (its shard only)."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import lecture_lib
from lecture_lib.grading import load_exercise
from lecture_lib.grading.harness import difference, record_dist
from lecture_lib.tensor_parallel import seeded_linear

ex = load_exercise("ex05")
POINTS = 10
RTOL, ATOL = 1e-5, 1e-6

#: What each checked value is, and what makes it right, in words (the first line of a failure).
WHY = {
    ("column", "y"): "its output should be this rank's out/p columns of x W^T + b (its own rows "
                     "of W and of b, applied to all of x)",
    ("column", "x grad"): "the gradient of its input x should be all of dL/dx on every rank: "
                          "each rank's layer sees only its own columns of y, so it holds only "
                          "their part of dL/dx, and f's backward all-reduces the parts",
    ("column", "w grad"): "the gradient of weight should be the one-device gradient's rows "
                          "of this rank (its out/p output features)",
    ("column", "b grad"): "the gradient of bias should be the one-device gradient's entries of "
                          "this rank (its out/p output features)",
    ("row", "y"): "its output should be all of x W^T + b: g's forward sums the partial "
                  "products x_i W_i^T over the ranks, and the bias is added once, after g",
    ("row", "x grad"): "the gradient of its input x_i should be this rank's in/p columns of "
                       "dL/dx (dL/dy W_i, local: g's backward is the identity)",
    ("row", "w grad"): "the gradient of weight should be the one-device gradient's columns "
                       "of this rank (its in/p input features)",
    ("row", "b grad"): "the gradient of bias should be the whole one-device gradient (every "
                       "rank holds all of b and adds it once, after g)",
    ("mlp", "y"): "its output should be the one-device MLP's",
    ("mlp", "x grad"): "its input's gradient should be the one-device MLP's",
}
LAYER = {"column": "ColumnParallelLinear", "row": "RowParallelLinear",
         "mlp": "the MLP column -> GELU -> row"}


def _held(layer):
    """Every tensor the layer keeps (parameters, buffers, tensor attributes of it and of its
    submodules), by name: shape, and the bytes of the storage it keeps alive (a view of the
    full weight keeps all of it)."""
    found = dict(layer.named_parameters())
    found.update(layer.named_buffers())
    for prefix, module in layer.named_modules():
        for key, value in vars(module).items():
            if isinstance(value, torch.Tensor) and all(value is not t for t in found.values()):
                found[f"{prefix}.{key}".lstrip(".")] = value
    storages, held = set(), {}
    for name, t in found.items():
        storage = t.untyped_storage()
        new = storage.data_ptr() not in storages
        storages.add(storage.data_ptr())
        held[name] = (tuple(t.shape), storage.nbytes() if new else 0)
    return held


def _run_layer(kind, full, x, w, xi, wi):
    """One layer on this rank against ``full``: its output and gradients, the process-group
    calls its forward and its backward ran, and the tensors it holds."""
    layer = (ex.ColumnParallelLinear if kind == "column" else ex.RowParallelLinear)(full)
    x_ref = x.clone().requires_grad_(True)
    y_ref = full(x_ref)
    (y_ref * w).sum().backward()
    xi = xi.clone().requires_grad_(True)
    with record_dist() as events:
        y = layer(xi)
        forward = [e["kind"] for e in events]
        (y * wi).sum().backward()
    return layer, x_ref, y_ref, xi, y, {"forward": forward,
                                        "backward": [e["kind"] for e in events][len(forward):]}


def _column_on_rank():
    r, p = dist.get_rank(), dist.get_world_size()
    full = seeded_linear(8, 12, seed=1)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(2))
    w = torch.randn(5, 12, generator=torch.Generator().manual_seed(3))
    layer, x_ref, y_ref, xi, y, calls = _run_layer("column", full, x, w, x, w.chunk(p, 1)[r])
    return {"y": (y.detach(), y_ref.detach().chunk(p, 1)[r]),
            "x grad": (xi.grad, x_ref.grad),
            "w grad": (layer.weight.grad, full.weight.grad.chunk(p, 0)[r]),
            "b grad": (layer.bias.grad, full.bias.grad.chunk(p, 0)[r]),
            "calls": calls, "held": _held(layer)}


def _row_on_rank():
    r, p = dist.get_rank(), dist.get_world_size()
    full = seeded_linear(12, 8, seed=4)
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(5))
    w = torch.randn(5, 8, generator=torch.Generator().manual_seed(6))
    layer, x_ref, y_ref, xi, y, calls = _run_layer("row", full, x, w, x.chunk(p, 1)[r], w)
    return {"y": (y.detach(), y_ref.detach()),
            "x grad": (xi.grad, x_ref.grad.chunk(p, 1)[r]),
            "w grad": (layer.weight.grad, full.weight.grad.chunk(p, 1)[r]),
            "b grad": (layer.bias.grad, full.bias.grad),
            "calls": calls, "held": _held(layer)}


def _mlp_on_rank():
    """Megatron's MLP: column, GELU, row; one all-reduce forward, one backward."""
    fc1, fc2 = seeded_linear(8, 16, seed=7), seeded_linear(16, 8, seed=8)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(9))
    x_ref = x.clone().requires_grad_(True)
    y_ref = fc2(F.gelu(fc1(x_ref)))
    y_ref.pow(2).sum().backward()
    col, row = ex.ColumnParallelLinear(fc1), ex.RowParallelLinear(fc2)
    xi = x.clone().requires_grad_(True)
    with record_dist() as events:
        y = row(F.gelu(col(xi)))
        forward = [e["kind"] for e in events]
        y.pow(2).sum().backward()
    return {"y": (y.detach(), y_ref.detach()), "x grad": (xi.grad, x_ref.grad),
            "calls": {"forward": forward, "backward": [e["kind"] for e in events][len(forward):]}}


def _ran(kinds):
    return " + ".join(kinds) if kinds else "no collective"


def _check_calls(results, kind, phase, expected):
    """Each rank's ``phase`` (forward or backward) ran exactly the collectives ``expected``."""
    why = {("column", "forward"): "f is the identity forward: every rank already holds all of "
                                  "x and its own rows of W, all that its output columns need, "
                                  "so nothing may be gathered or reduced",
           ("column", "backward"): "f's backward all-reduces the input's gradient, once; the "
                                   "weight and bias gradients are local",
           ("row", "forward"): "g's forward all-reduces the partial products, once; the input "
                               "arrives already split (no gather)",
           ("row", "backward"): "g is the identity backward: dL/dy is already whole on every "
                                "rank",
           ("mlp", "forward"): "f's identity, then g's all-reduce",
           ("mlp", "backward"): "g's identity, then f's all-reduce"}[kind, phase]
    for rank, res in enumerate(results):
        got = res["calls"][phase]
        if got == expected:
            continue
        ran = (f"ran a collective in its {phase} ({_ran(got)})" if got and not expected else
               f"ran {_ran(got)} in its {phase}")
        raise AssertionError(f"rank {rank}: {LAYER[kind]} {ran}; expected {_ran(expected)}: "
                             f"{why}")


def _check(results, kind, what):
    """Each rank's ``what`` against the one-device value, in words when it differs."""
    for rank, res in enumerate(results):
        got, expected = res[what]
        head = f"rank {rank}: {LAYER[kind]}: {WHY[kind, what]}"
        assert got is not None, f"{head}; it is None (did the gradient reach it?)"
        _same(got, expected, head)


def _same(got, expected, head, rtol=RTOL, atol=ATOL):
    """``got`` equals ``expected``, else ``head`` and where and by how much they differ."""
    try:
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
    except AssertionError as exc:
        raise AssertionError(f"{head}; it differs: "
                             f"{difference(got, expected, exc, rtol=rtol, atol=atol)}") from None


@pytest.mark.parametrize("world_size", [2, 4])
def test_column_parallel_forward_gives_this_ranks_columns_without_communicating(world_size):
    """This rank's columns of y, from its own rows of W, with no collective at all."""
    results = ex.run(_column_on_rank, world_size, timeout=60)
    _check(results, "column", "y")
    _check_calls(results, "column", "forward", [])


@pytest.mark.parametrize("world_size", [2, 4])
def test_column_parallel_backward_all_reduces_the_input_gradient(world_size):
    """All of dL/dx on every rank (one all-reduce), and this rank's rows of dL/dW, dL/db."""
    results = ex.run(_column_on_rank, world_size, timeout=60)
    for what in ("x grad", "w grad", "b grad"):
        _check(results, "column", what)
    _check_calls(results, "column", "backward", ["all_reduce"])


@pytest.mark.parametrize("world_size", [2, 4])
def test_row_parallel_forward_sums_the_partial_products(world_size):
    """All of y on every rank, from one all-reduce of the partial products."""
    results = ex.run(_row_on_rank, world_size, timeout=60)
    _check(results, "row", "y")
    _check_calls(results, "row", "forward", ["all_reduce"])


@pytest.mark.parametrize("world_size", [2, 4])
def test_row_parallel_backward_is_local(world_size):
    """This rank's columns of dL/dx and dL/dW, all of dL/db, with no collective."""
    results = ex.run(_row_on_rank, world_size, timeout=60)
    for what in ("x grad", "w grad", "b grad"):
        _check(results, "row", what)
    _check_calls(results, "row", "backward", [])


def _shard_message(rank, kind, held, want):
    have = ", ".join(f"{name} {shape}: {nbytes} bytes of storage"
                     for name, (shape, nbytes) in held.items())
    total, most = sum(b for _, b in held.values()), sum(b for _, b in want.values())
    shards = ", ".join(f"{name} {shape}" for name, (shape, _) in want.items())
    return (f"rank {rank}: {LAYER[kind]} holds {total} bytes of tensors ({have}); its shard is "
            f"{shards}, {most} bytes: keep only this rank's part of the full layer, as new "
            "tensors (a view of the full weight, or the full nn.Linear kept as an attribute, "
            "keeps all of it in memory), and compute from the shard alone")


@pytest.mark.weight(2)
@pytest.mark.parametrize("world_size", [2, 4])
def test_each_layer_holds_only_its_shard(world_size):
    """Column: out/p rows of W and b; row: in/p columns of W and all of b (float32); no more
    storage than that, by parameters, buffers or tensor attributes."""
    p = world_size
    wants = {"column": {"weight": ((12 // p, 8), 12 // p * 8 * 4),
                        "bias": ((12 // p,), 12 // p * 4)},
             "row": {"weight": ((8, 12 // p), 8 * 12 // p * 4), "bias": ((8,), 8 * 4)}}
    for kind, fn in (("column", _column_on_rank), ("row", _row_on_rank)):
        for rank, res in enumerate(ex.run(fn, world_size, timeout=60)):
            held, want = res["held"], wants[kind]
            shapes = {name: shape for name, (shape, _) in held.items()}
            assert shapes == {name: shape for name, (shape, _) in want.items()} and \
                sum(b for _, b in held.values()) <= sum(b for _, b in want.values()), \
                _shard_message(rank, kind, held, want)


@pytest.mark.weight(3)
def test_megatron_mlp_equals_one_device_with_one_all_reduce_each_way():
    """Column -> GELU -> row: the one-device MLP's output and input gradient, with one
    all-reduce forward (g) and one backward (f), nothing else."""
    results = ex.run(_mlp_on_rank, 2, timeout=60)
    _check(results, "mlp", "y")
    _check(results, "mlp", "x grad")
    _check_calls(results, "mlp", "forward", ["all_reduce"])
    _check_calls(results, "mlp", "backward", ["all_reduce"])


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


@pytest.mark.weight(2)
def test_f_and_g_leave_the_tensors_autograd_hands_them_alone():
    """f and g on their own give the right values and gradients where autograd still needs
    (or cannot write) the tensors it hands them."""
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
        _same(res["z"], z, f"rank {rank}: tanh(g(tanh(a))) forward should be tanh of the sum "
              "over the ranks of tanh(a) (g's forward all-reduces)")
        want = w * (1 - z ** 2) * (1 - tanh_a[rank] ** 2)
        _same(res["a grad"], want, f"rank {rank}: the gradient of a through tanh(g(tanh(a))) "
              "should pass g unchanged (g's backward is the identity; is g's input left alone?)")
        _same(res["b grad"], torch.full((5,), float(p)), f"rank {rank}: the gradient of b "
              f"through f(b).sum() should be every rank's ones, all-reduced ({p} everywhere)",
              rtol=None, atol=None)


@pytest.mark.weight(0.5)
def test_uneven_split_is_refused():
    """An out_features (column) not divisible by the ranks raises ValueError."""
    def build():
        ex.ColumnParallelLinear(seeded_linear(4, 8))          # an even split builds
        return ex.ColumnParallelLinear(seeded_linear(4, 6))
    with pytest.raises(lecture_lib.RankError, match="not divisible"):
        ex.run(build, 4, timeout=60)
