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
    with_state = [p for p in listed if len(opt.state.get(p, {})) > 0]
    opt.zero_grad()
    return {"after": after, "listed": len(listed), "with_state": len(with_state),
            "zeroed": all(p.grad is None or not p.grad.any() for p in listed)}


def _equal_to_adamw(result, steps):
    """Step by step, the rank's parameters against plain AdamW's, computed here (rtol 1e-6)."""
    _, want = _train(steps, _adamw)
    return [all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(got, ref))
            for got, ref in zip(result["after"], want)] + [False] * (steps - len(result["after"]))


def test_steps_equal_adamw_on_every_rank():
    for rank, r in enumerate(ex.run(_against_adamw, 2, 4, timeout=60)):
        equal = _equal_to_adamw(r, 4)
        assert equal == [True] * 4, f"rank {rank}: steps equal to AdamW: {equal}"


def test_param_groups_list_everything_and_state_is_sharded():
    world = 2
    results = ex.run(_against_adamw, world, 3, timeout=60)
    n = len(list(ToyMLP(SIZES).parameters())) + 1
    for rank, r in enumerate(results):
        assert r["listed"] == n, f"rank {rank}: param_groups list {r['listed']} of {n}"
        assert r["zeroed"], f"rank {rank}: zero_grad missed a parameter"
    counts = [r["with_state"] for r in results]
    assert sum(counts) == n, f"every parameter has state on exactly one rank: {counts}"
    assert max(counts) < n, f"one rank keeps state for everything: {counts}"


def test_works_at_world_size_4():
    for rank, r in enumerate(ex.run(_against_adamw, 4, 3, timeout=60)):
        equal = _equal_to_adamw(r, 3)
        assert equal == [True] * 3, f"rank {rank}: steps equal to AdamW: {equal}"
        assert r["with_state"] <= 2, f"rank {rank} keeps state for {r['with_state']} parameters"
