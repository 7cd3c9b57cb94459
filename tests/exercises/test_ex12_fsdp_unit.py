"""ex12: one FSDP unit with a compute dtype. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file. The ranks run in the
exercise's sandbox (``ex.run``) and return data; every verdict is reached here.

Tolerances: fp32 training equal to one process within rtol 1e-5, atol 1e-6 (SGD, so updates
are proportional to gradients). bf16: the shards' gradients against a one-process model
running the same casts (bf16 weights and backward, fp32 gradients): the batch is split over
ranks and the reduce-scatter sums bf16 numbers, so the two round differently. Tolerance
lecture_lib.tolerance.rtol(bf16, DEPTH), relative to each gradient's norm (scale_floor):
DEPTH counts the bf16 roundings in sequence, 4 operations forward (linear, ReLU, linear,
loss), 4 backward, 2 ranks summed.
"""
import pytest
import torch
import torch.distributed as dist

from lecture_lib import tolerance
from lecture_lib.comm import record_comm
from lecture_lib.grading import load_exercise
from lecture_lib.grading.harness import record_dist
from lecture_lib.models import (
    ToyMLP,
    TrainResult,
    assert_same_training,
    regression_batch,
    train_reference,
)

ex = load_exercise("ex12")
POINTS = 10
SIZES = (5, 7, 3)                 # 35, 7, 21, 3 elements: no world size divides them all
STEPS, BATCH = 3, 8
DEPTH = 2 * 4 + 2


def batches(step):
    return regression_batch(step, BATCH, SIZES)


def _full(unit):
    """The unit's full parameters, rebuilt from every rank's shard (the test's own gather)."""
    out = []
    for shard, shape in zip(unit.shards, unit.shapes):
        pieces = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, shard.detach())
        out.append(torch.cat(pieces)[:shape.numel()].reshape(shape))
    return out


def _train(dtype, steps):
    model = ToyMLP(SIZES)
    units = [ex.FSDPUnit(layer, dtype) for layer in model.layers]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)           # the shards, built the usual way
    r, n = dist.get_rank(), dist.get_world_size()
    losses, seen, after_forward = [], [], []
    model.layers[0].register_forward_pre_hook(           # runs after the unit's gather
        lambda m, a: seen.append((m.weight.dtype, tuple(m.weight.shape))))
    for step in range(steps):
        x, y = batches(step)
        x, y = x[r * BATCH // n:(r + 1) * BATCH // n], y[r * BATCH // n:(r + 1) * BATCH // n]
        opt.zero_grad()
        with record_comm() as log, record_dist() as moved:
            loss = model(x.to(dtype), y.to(dtype))
            after_forward.append([f.numel() for u in units for f in u.full])
            loss.backward()
        opt.step()
        total = loss.detach().float()
        dist.all_reduce(total)
        losses.append(total.item() / n)
    names = [name for name, _ in ToyMLP(SIZES).named_parameters()]
    params = dict(zip(names, (p for u in units for p in _full(u))))
    return {"result": TrainResult(losses, params), "seen": seen,
            "shards": [(tuple(p.shape), p.dtype, p.grad.dtype) for p in model.parameters()],
            "held": [f.numel() for u in units for f in u.full], "after_forward": after_forward,
            "gathered": log.buffer_bytes(kind="all_gather"),
            "scattered": log.buffer_bytes(kind="reduce_scatter"),
            "calls": [e["kind"] for e in moved], "units": len(units),
            "grads": [p.grad.clone() for p in model.parameters()]}


def _both(steps):
    return {"fp32": _train(torch.float32, steps), "bf16": _train(torch.bfloat16, 1)}


def _too_few_gathers(got):
    """Why a step ran fewer all-gathers than 2 per unit, in words."""
    kept = sum(got["after_forward"][0])
    if kept:
        return (f"after forward the units still held {kept} elements of full weights "
                "(expected 0): they were never freed after forward, so never gathered again "
                "for backward. free() drops them (after forward and after backward), and "
                "gather() runs again, in full, before backward")
    return ("a unit's weights were not gathered again for backward: gather() must run its "
            "all-gather every time it is called")


@pytest.mark.weight(3)
def test_one_all_gather_and_one_reduce_scatter_per_unit():
    """Per unit and step: one all-gather before forward, one again before backward, one
    reduce-scatter of all the unit's gradients, and no other collective."""
    for rank, r in enumerate(ex.run(_both, 2, 1, timeout=60)):
        got = r["fp32"]
        calls, units = got["calls"], got["units"]
        gathers, scatters = calls.count("all_gather"), calls.count("reduce_scatter")
        others = sorted({c for c in calls if c not in ("all_gather", "reduce_scatter")})
        assert gathers >= 2 * units, (
            f"rank {rank}: {gathers} all-gathers in one step of {units} units, expected "
            f"{2 * units}: one per unit before forward and one again before backward; "
            + _too_few_gathers(got))
        assert gathers == 2 * units, (
            f"rank {rank}: {gathers} all-gathers in one step of {units} units (2 parameters "
            f"each), expected {2 * units}: ONE per unit in forward and one in backward "
            "(concatenate the unit's shards and gather them together, not parameter by "
            "parameter)")
        assert scatters == units, (
            f"rank {rank}: {scatters} reduce-scatters in one step of {units} units, expected "
            f"{units}: one per unit, of all its gradients together")
        assert not others, f"rank {rank}: the step also ran {others}; an FSDP unit needs none"


@pytest.mark.weight(2)
def test_fp32_trains_like_one_process_and_frees_what_it_gathers():
    """fp32: equal to one process; no full weight left after backward; shard shapes."""
    ref = train_reference(ToyMLP(SIZES), batches, STEPS, lr=0.1, optimizer="sgd")
    for rank, r in enumerate(ex.run(_both, 2, STEPS, timeout=60)):
        got = r["fp32"]
        assert_same_training(got["result"], ref, rtol=1e-5, atol=1e-6)
        assert got["held"] == [0] * 4, (f"rank {rank}: elements of full weights left after "
                                        f"backward: expected [0, 0, 0, 0], got {got['held']}")
        expected = [((p.numel() + 1) // 2,) for p in ToyMLP(SIZES).parameters()]
        shapes = [s for s, _, _ in got["shards"]]
        assert shapes == expected, f"rank {rank}: shard shapes: expected {expected}, got {shapes}"


def _cast_reference_grads():
    """One process, the same casts: bf16 weights and backward, gradients cast to fp32."""
    model = ToyMLP(SIZES).to(torch.bfloat16)
    x, y = batches(0)
    model(x.bfloat16(), y.bfloat16()).backward()
    return [p.grad.float().reshape(-1) for p in model.parameters()]


@pytest.mark.weight(3)
@pytest.mark.sixteen_bit
def test_bf16_compute_gathers_half_the_bytes_and_returns_fp32_grads():
    """bf16: computes in bf16, moves half the bytes, returns fp32 gradients like one process's."""
    ref = _cast_reference_grads()
    results = ex.run(_both, 2, 1, timeout=60)
    for rank, r in enumerate(results):
        fp32, bf16 = r["fp32"], r["bf16"]
        assert bf16["seen"][0] == (torch.bfloat16, (7, 5)), (
            f"rank {rank}: the first layer computed with (dtype, weight shape): expected "
            f"(torch.bfloat16, (7, 5)), got {bf16['seen'][0]}")
        dtypes = [(d, g) for _, d, g in bf16["shards"]]
        assert all(d == g == torch.float32 for d, g in dtypes), (
            f"rank {rank}: (shard, shard grad) dtypes: expected float32 for all, got {dtypes}")
        assert bf16["gathered"] * 2 == fp32["gathered"] > 0, (
            f"rank {rank}: bytes all-gathered, bf16 vs fp32: expected half, got "
            f"{bf16['gathered']} vs {fp32['gathered']} (cast before gathering)")
        assert bf16["scattered"] * 2 == fp32["scattered"] > 0, (
            f"rank {rank}: bytes reduce-scattered, bf16 vs fp32: expected half, got "
            f"{bf16['scattered']} vs {fp32['scattered']} (reduce-scatter in the compute dtype)")
        assert bf16["held"] == [0] * 4, (f"rank {rank}: full weights left after backward: "
                                         f"expected [0, 0, 0, 0], got {bf16['held']}")
    rtol = tolerance.rtol(torch.bfloat16, DEPTH)
    scale = tolerance.scale_floor(dict(enumerate(ref)))
    for i, want in enumerate(ref):
        got = torch.cat([r["bf16"]["grads"][i] for r in results])[:want.numel()]
        err = (got - want).norm().item() / scale[i]
        assert err <= rtol, (
            f"parameter {i}: gathered bf16 gradient against one process: expected relative "
            f"error <= {rtol:.3g}, got {err:.3g}")


def test_works_at_world_size_4():
    """With 4 ranks, fp32 training equals one process."""
    ref = train_reference(ToyMLP(SIZES), batches, STEPS, lr=0.1, optimizer="sgd")
    for r in ex.run(_both, 4, STEPS, timeout=60):
        assert_same_training(r["fp32"]["result"], ref, rtol=1e-5, atol=1e-6)
