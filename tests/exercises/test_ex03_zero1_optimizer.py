"""ex03: the ZeRO-1 sharded optimizer. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file."""
import torch

from lecture_lib.grading import load_exercise
from lecture_lib.models import ToyMLP, regression_batch

ex = load_exercise("ex03")
POINTS = 10
SIZES = (8, 16, 16, 4)


def _against_adamw(steps):
    """Same gradients into ShardedOptimizer and plain AdamW: the same parameters, step for step."""
    ours, ref = ToyMLP(SIZES), ToyMLP(SIZES)
    opt = ex.ShardedOptimizer(ours.parameters(), torch.optim.AdamW, lr=1e-2, weight_decay=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    extra, extra_ref = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    equal = []
    for step in range(steps):
        if step == 2:
            opt.add_param_group({"params": [extra], "lr": 0.1})
            ref_opt.add_param_group({"params": [extra_ref], "lr": 0.1})
        x, y = regression_batch(step, 16, SIZES)
        for model, o, e in ((ours, opt, extra), (ref, ref_opt, extra_ref)):
            o.zero_grad()
            (model(x, y) + (e * e).sum()).backward()
            o.step()
        equal.append(all(torch.allclose(a, b, rtol=1e-6, atol=1e-7)
                         for a, b in zip([*ours.parameters(), extra], [*ref.parameters(), extra_ref])))
    listed = [p for g in opt.param_groups for p in g["params"]]
    with_state = [p for p in listed if len(opt.state.get(p, {})) > 0]
    opt.zero_grad()
    return {"equal": equal, "listed": len(listed), "with_state": len(with_state),
            "zeroed": all(p.grad is None or not p.grad.any() for p in listed)}


def test_steps_equal_adamw_on_every_rank():
    for rank, r in enumerate(ex.run(_against_adamw, 2, 4, timeout=60)):
        assert r["equal"] == [True] * 4, f"rank {rank}: steps equal to AdamW: {r['equal']}"


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
        assert r["equal"] == [True] * 3, f"rank {rank}: {r['equal']}"
        assert r["with_state"] <= 2, f"rank {rank} keeps state for {r['with_state']} parameters"
