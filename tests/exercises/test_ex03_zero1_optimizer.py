"""ex03: the ZeRO-1 sharded optimizer. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file. Besides the parameters (equal
to plain AdamW's) the tests check the point of ZeRO-1: each rank broadcasts, in ``step()``,
the parameters it owns, and no optimizer on a rank keeps state for parameters it does not
own."""
import torch

from lecture_lib.grading import load_exercise
from lecture_lib.grading.harness import record_dist
from lecture_lib.models import ToyMLP, regression_batch

ex = load_exercise("ex03")
POINTS = 10
SIZES = (8, 16, 16, 4)


def _train(steps, make_optimizer, sent=None):
    """ToyMLP and one extra parameter (its own group from step 2 on), trained on the same
    batches; the parameters after every step. With a list as ``sent`` (on a rank), each
    step's broadcasts in ``step()`` are appended to it: ``{source rank: bytes}``."""
    model, extra = ToyMLP(SIZES), torch.nn.Parameter(torch.ones(3))
    opt = make_optimizer(model.parameters())
    after = []
    for step in range(steps):
        if step == 2:
            opt.add_param_group({"params": [extra], "lr": 0.1})
        x, y = regression_batch(step, 16, SIZES)
        opt.zero_grad()
        (model(x, y) + (extra * extra).sum()).backward()
        if sent is None:
            opt.step()
        else:
            with record_dist() as events:
                opt.step()
            by_root = {}
            for e in events:
                key = e.get("root", e["kind"]) if e["kind"] == "broadcast" else e["kind"]
                by_root[key] = by_root.get(key, 0) + e["bytes"]
            sent.append(by_root)
        after.append([p.detach().clone() for p in [*model.parameters(), extra]])
    return opt, after


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)


def _against_adamw(steps):
    """On a rank: ShardedOptimizer's parameters after every step, what it holds, what each
    step broadcast, and which parameters every optimizer made on this rank keeps state for."""
    made, init = [], torch.optim.Optimizer.__init__

    def recording_init(self, *args, **kwargs):       # every optimizer, however it is made
        made.append(self)
        return init(self, *args, **kwargs)
    sent = []
    torch.optim.Optimizer.__init__ = recording_init
    try:
        opt, after = _train(steps, lambda params: ex.ShardedOptimizer(
            params, torch.optim.AdamW, lr=1e-2, weight_decay=0.01), sent)
    finally:
        torch.optim.Optimizer.__init__ = init        # the worker serves later calls
    listed = [p for g in opt.param_groups for p in g["params"]]
    with_state = [i for i, p in enumerate(listed) if len(opt.state.get(p, {})) > 0]
    kept = {f"{type(o).__name__} #{k}": sorted(i for i, p in enumerate(listed)
                                               if len(o.state.get(p, {})) > 0)
            for k, o in enumerate(made)}
    opt.zero_grad()
    return {"after": after, "listed": len(listed), "with_state": with_state,
            "zeroed": all(p.grad is None or not p.grad.any() for p in listed),
            "sent": sent, "kept": kept, "bytes": [p.numel() * p.element_size() for p in listed]}


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


def _owned_bytes(r, world, steps):
    """Per step: {rank: bytes of the parameters it owns} (the extra parameter from step 2)."""
    sizes = r["bytes"]
    out = []
    for step in range(steps):
        present = sizes if step >= 2 else sizes[:-1]
        owned = {}
        for i, nbytes in enumerate(present):
            owned[i % world] = owned.get(i % world, 0) + nbytes
        out.append(owned)
    return out


def test_step_broadcasts_each_owners_parameters_and_keeps_no_other_state():
    world, steps = 2, 3
    for rank, r in enumerate(ex.run(_against_adamw, world, steps, timeout=60)):
        for step, (sent, owned) in enumerate(zip(r["sent"], _owned_bytes(r, world, steps))):
            assert sent, (
                f"rank {rank}: step() {step} communicated nothing: after stepping the "
                "parameters it owns, each rank must broadcast them (dist.broadcast from the "
                "owner) so that every rank ends with all of them; a rank that updates every "
                "parameter itself is plain data parallelism, not ZeRO-1")
            assert sent == owned, (
                f"rank {rank}: step() {step} broadcast {sent} bytes by source rank (other "
                f"collectives by kind), expected {owned}: every parameter once, from its "
                f"owner (parameter i from rank i % {world})")
        want = set(_expected_owned(rank, world, r["listed"]))
        for name, kept in r["kept"].items():
            extra = sorted(set(kept) - want)
            assert not extra, (
                f"rank {rank}: an optimizer made during training ({name}) keeps state for "
                f"parameters {extra}, which rank {rank} does not own: only the owner may keep a "
                "parameter's Adam moments (that is the memory ZeRO-1 saves)")
