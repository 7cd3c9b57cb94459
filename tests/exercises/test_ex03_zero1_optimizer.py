"""ex03: the ZeRO-1 sharded optimizer. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file."""
import torch

from lecture_lib.grading import load_exercise
from lecture_lib.models import ToyMLP, regression_batch

ex = load_exercise("ex03")
POINTS = 10
SIZES = (8, 16, 16, 4)


def _train(steps, make_optimizer):
    """ToyMLP and one extra parameter (its own group from step 2 on), trained on the same
    batches; the parameters after every step."""
    model, extra = ToyMLP(SIZES), torch.nn.Parameter(torch.ones(3))
    opt = make_optimizer(model.parameters())
    after = []
    for step in range(steps):
        if step == 2:
            opt.add_param_group({"params": [extra], "lr": 0.1})
        x, y = regression_batch(step, 16, SIZES)
        opt.zero_grad()
        (model(x, y) + (extra * extra).sum()).backward()
        opt.step()
        after.append([p.detach().clone() for p in [*model.parameters(), extra]])
    return opt, after


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)


def _against_adamw(steps):
    """On a rank: ShardedOptimizer's parameters after every step, and what it holds."""
    opt, after = _train(steps, lambda params: ex.ShardedOptimizer(
        params, torch.optim.AdamW, lr=1e-2, weight_decay=0.01))
    listed = [p for g in opt.param_groups for p in g["params"]]
    with_state = [i for i, p in enumerate(listed) if len(opt.state.get(p, {})) > 0]
    opt.zero_grad()
    return {"after": after, "listed": len(listed), "with_state": with_state,
            "zeroed": all(p.grad is None or not p.grad.any() for p in listed)}


def _differences(result, steps):
    """Step by step, the largest difference of the rank's parameters from plain AdamW's
    (computed here), or None where a step is missing."""
    _, want = _train(steps, _adamw)
    got = result["after"] + [None] * (steps - len(result["after"]))
    return [None if g is None else max((a - b).abs().max().item() for a, b in zip(g, ref))
            for g, ref in zip(got, want)]


def _check_equal(rank, result, steps):
    _, want = _train(steps, _adamw)
    for k, (got, ref) in enumerate(zip(result["after"], want)):
        if not all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(got, ref)):
            diffs = _differences(result, steps)
            raise AssertionError(
                f"rank {rank}: after step {k} the parameters differ from plain AdamW's by up to "
                f"{diffs[k]:.2e} (expected equal within rtol 1e-6); per step: {diffs}")
    assert len(result["after"]) == steps, f"rank {rank}: {len(result['after'])} of {steps} steps"


def _expected_owned(rank, world, n):
    return [i for i in range(n) if i % world == rank]


def test_steps_equal_adamw_on_every_rank():
    for rank, r in enumerate(ex.run(_against_adamw, 2, 4, timeout=60)):
        _check_equal(rank, r, 4)


def test_param_groups_list_everything_and_state_is_sharded():
    world = 2
    results = ex.run(_against_adamw, world, 3, timeout=60)
    n = len(list(ToyMLP(SIZES).parameters())) + 1
    for rank, r in enumerate(results):
        assert r["listed"] == n, (f"rank {rank}: param_groups list {r['listed']} parameters, "
                                  f"expected all {n}")
        assert r["zeroed"], f"rank {rank}: zero_grad missed a parameter"
    for rank, r in enumerate(results):
        want = _expected_owned(rank, world, n)
        assert r["with_state"] == want, (
            f"rank {rank}: opt.state has entries for parameters {r['with_state']}, expected "
            f"{want} (round-robin: parameter i on rank i % {world})"
            + ("; none at all: is opt.state the wrapped optimizer's state?"
               if not r["with_state"] else ""))


def test_works_at_world_size_4():
    world = 4
    n = len(list(ToyMLP(SIZES).parameters())) + 1
    for rank, r in enumerate(ex.run(_against_adamw, world, 3, timeout=60)):
        _check_equal(rank, r, 3)
        want = _expected_owned(rank, world, n)
        assert r["with_state"] == want, (
            f"rank {rank}: opt.state has entries for parameters {r['with_state']}, expected "
            f"{want}" + ("; none at all: is opt.state the wrapped optimizer's state?"
                         if not r["with_state"] else ""))
