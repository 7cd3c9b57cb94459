"""ex03: the ZeRO-1 sharded optimizer. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file. Besides the parameters (equal
to plain AdamW's) the tests check the point of ZeRO-1: each rank broadcasts, in ``step()``,
the parameters it owns, and no optimizer on a rank keeps state for parameters it does not
own. Most of the points: ``optimizer_cls`` is really used, with only the owned parameters
(a class of the test's own, SGD with momentum, notes what it is given and keeps), also on
ranks that own no parameter of a group (either choice the statement allows)."""
import pytest
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


def _check_equal(rank, result, steps, want=None, name="plain AdamW"):
    """Step by step, the rank's parameters equal ``want`` (default: plain AdamW's)."""
    want = _train(steps, _adamw)[1] if want is None else want
    for k, (got, ref) in enumerate(zip(result["after"], want)):
        if not all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(got, ref)):
            diffs = [max((a - b).abs().max().item() for a, b in zip(g, r))
                     for g, r in zip(result["after"], want)]
            raise AssertionError(
                f"rank {rank}: after step {k} the parameters differ from {name}'s by up to "
                f"{diffs[k]:.2e} (expected equal within rtol 1e-6); per step: "
                + ", ".join(f"{d:.2e}" for d in diffs))
    assert len(result["after"]) == steps, f"rank {rank}: {len(result['after'])} of {steps} steps"


def _expected_owned(rank, world, n):
    return [i for i in range(n) if i % world == rank]


def test_steps_equal_adamw_on_every_rank():
    """With AdamW, every rank's parameters equal plain AdamW's after every step."""
    for rank, r in enumerate(ex.run(_against_adamw, 2, 4, timeout=60)):
        _check_equal(rank, r, 4)


def test_param_groups_list_everything_and_state_is_sharded():
    """param_groups list every parameter; opt.state only the owned ones."""
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
    """With 4 ranks: equal to plain AdamW, state only for the owned parameters."""
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
    """step() broadcasts each parameter once from its owner; no optimizer keeps others' state."""
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


# -- optimizer_cls is really used, with only the owned parameters -----------------------------

SGD_KWARGS = dict(lr=0.05, momentum=0.9)


def _recording(base, made):
    """A subclass of ``base`` (the test's own ``optimizer_cls``): every instance is appended to
    ``made`` and keeps, in ``given``, every parameter it is given."""
    class Recording(base):
        def __init__(self, params, *args, **kwargs):
            self.given = []
            made.append(self)
            super().__init__(params, *args, **kwargs)

        def add_param_group(self, param_group):
            params = param_group["params"]
            params = [params] if isinstance(params, torch.Tensor) else list(params)
            self.given.extend(params)
            super().add_param_group({**param_group, "params": params})
    return Recording


def _wrapped(opt, made, listed):
    """What the test's optimizer class saw on this rank, as indices into ``listed``."""
    index = {p: i for i, p in enumerate(listed)}
    return {"made": len(made),
            "given": sorted(index.get(p, -1) for o in made for p in o.given),
            "kept": sorted(index.get(p, -1) for o in made for p, st in o.state.items()
                           if len(st) > 0),
            "shown": sorted(index.get(p, -1) for p, st in opt.state.items() if len(st) > 0),
            "same_state": any(opt.state is o.state for o in made)}


def _with_recording_sgd(steps):
    """On a rank: ShardedOptimizer wrapping the recording SGD (momentum) in the usual run."""
    made = []
    sgd = _recording(torch.optim.SGD, made)
    opt, after = _train(steps, lambda params: ex.ShardedOptimizer(params, sgd, **SGD_KWARGS))
    listed = [p for g in opt.param_groups for p in g["params"]]
    return {"after": after, **_wrapped(opt, made, listed)}


def _sgd(params):
    return torch.optim.SGD(params, **SGD_KWARGS)


def _check_wrapped(rank, r, owned):
    """The test's optimizer class was used, given exactly the owned parameters, and keeps the
    state, which opt.state shows."""
    assert r["made"] > 0 or not owned, (
        f"rank {rank}: no optimizer of the class the test passed as optimizer_cls (a subclass "
        f"of SGD that notes what it is given) was made, though rank {rank} owns parameters "
        f"{owned}: the owned parameters must be stepped by optimizer_cls(..., **kwargs), "
        "whatever class it is, not by an optimizer of your own")
    assert r["given"] == owned, (
        f"rank {rank}: the wrapped optimizer (optimizer_cls) was given parameters {r['given']}, "
        f"expected exactly the ones rank {rank} owns, {owned}, each once (only the owner keeps "
        "a parameter's optimizer state: that is the memory ZeRO-1 saves)")
    assert r["kept"] == owned, (
        f"rank {rank}: the wrapped optimizer keeps state (momentum) for parameters {r['kept']}, "
        f"expected {owned}, the ones rank {rank} owns")
    assert r["shown"] == owned and (r["same_state"] or not owned), (
        f"rank {rank}: opt.state shows state for parameters {r['shown']}, expected {owned}"
        + ("" if r["same_state"] else "; opt.state must be the wrapped optimizer's state "
           "itself (the same dict)"))


@pytest.mark.weight(4)
def test_wraps_the_optimizer_class_it_is_given_with_only_the_owned_parameters():
    """optimizer_cls (here SGD with momentum, recording) steps the owned parameters, and only
    them: the result equals plain SGD's, and the state lives in it, only for the owned ones."""
    world, steps = 2, 3
    _, want = _train(steps, _sgd)
    for rank, r in enumerate(ex.run(_with_recording_sgd, world, steps, timeout=60)):
        _check_wrapped(rank, r, _expected_owned(rank, world, 7))
        _check_equal(rank, r, steps, want, "plain SGD with momentum")


def _small_train(steps, make_optimizer):
    """Two parameters in the first group, three more (a group of their own) from step 1 on:
    with 4 ranks, ranks 2 and 3 own nothing of the first group and rank 1 nothing of the
    second. The parameters after every step."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(3, 1), torch.nn.Linear(2, 1)
    extra = torch.nn.Parameter(torch.ones(2))
    opt = make_optimizer(first.parameters())
    after = []
    for step in range(steps):
        if step == 1:
            opt.add_param_group({"params": [*second.parameters(), extra], "lr": 0.02})
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(step))
        loss = first(x).pow(2).mean()
        if step >= 1:
            loss = loss + second(x[:, :2]).pow(2).mean() + (extra * x[0, :2]).sum() ** 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        after.append([p.detach().clone()
                      for p in [*first.parameters(), *second.parameters(), extra]])
    return opt, after


def _small_with_recording_sgd(steps):
    made = []
    sgd = _recording(torch.optim.SGD, made)
    opt, after = _small_train(steps, lambda ps: ex.ShardedOptimizer(ps, sgd, **SGD_KWARGS))
    listed = [p for g in opt.param_groups for p in g["params"]]
    return {"after": after, "listed": len(listed), **_wrapped(opt, made, listed)}


@pytest.mark.weight(2)
def test_a_rank_may_own_no_parameter_of_a_group():
    """4 ranks, groups of 2 and 3 parameters: some rank owns nothing of each group (and ranks
    2 and 3 nothing at all when it is made); either choice the statement allows works."""
    world, steps = 4, 3
    _, want = _small_train(steps, _sgd)
    for rank, r in enumerate(ex.run(_small_with_recording_sgd, world, steps, timeout=60)):
        assert r["listed"] == 5, (f"rank {rank}: param_groups list {r['listed']} parameters, "
                                  "expected all 5")
        _check_wrapped(rank, r, _expected_owned(rank, world, 5))
        _check_equal(rank, r, steps, want, "plain SGD with momentum")
