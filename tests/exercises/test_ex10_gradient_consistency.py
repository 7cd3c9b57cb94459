"""ex10: first_inconsistent names the first parameter whose gradient or value differs.
Run against solutions/ by default; the grader points LECTURE_EXERCISE_PATH at a student's file."""
import functools

import pytest
import torch
import torch.distributed as dist

from lecture_lib.grading import load_exercise
from lecture_lib.models import ToyMLP, regression_batch

ex = load_exercise("ex10")
POINTS = 10
SIZES = (8, 16, 16, 4)


def _replica():
    """A model whose replicas agree: same init, gradients of the same batch."""
    model = ToyMLP(SIZES)
    model(*regression_batch(0, 8, SIZES)).backward()
    return model


def _state(model):
    return {n: (p.detach().clone(), None if p.grad is None else p.grad.clone())
            for n, p in model.named_parameters()}


def _same(before, after):
    """The model's values and gradients as first_inconsistent found them."""
    return before.keys() == after.keys() and all(
        torch.equal(before[n][0], after[n][0]) and (before[n][1] is None) == (after[n][1] is None)
        and (before[n][1] is None or torch.equal(before[n][1], after[n][1])) for n in before)


def _cases():
    rank = dist.get_rank()
    out = {}

    def check(case, model):
        before = _state(model)
        out[case] = ex.first_inconsistent(model, atol=1e-6)
        out[case + " unchanged"] = (before, _state(model))    # compared in the test

    check("agree", _replica())
    m = _replica()
    if rank == 1:
        m.layers[1].weight.grad[2, 3] += 0.25
    check("grad", m)
    m = _replica()
    if rank == 1:
        with torch.no_grad():
            m.layers[2].bias[1] -= 0.5
    check("value", m)
    m = _replica()
    if rank == 1:                       # value of layers.0.weight and grad of layers.0.weight:
        m.layers[0].weight.grad[0, 0] += 1.0          # the gradient comes first
        with torch.no_grad():
            m.layers[0].weight[0, 0] += 1.0
            m.layers[0].bias[0] += 1.0
    check("first", m)
    m = _replica()
    if rank == 1:
        m.layers[2].weight.grad[0, 0] += 1e-8         # below atol
    check("tolerance", m)
    m = _replica()
    for p in m.parameters():
        p.grad = None                                 # no gradient anywhere: zeros agree
    check("no grads", m)
    m = _replica()
    if rank == 1:
        m.layers[0].weight.grad = None                # missing on one rank: differs
    check("missing", m)
    return out


@functools.lru_cache(maxsize=None)
def results():
    return ex.run(_cases, 2, timeout=60)


def test_replicas_that_agree_give_none():
    assert all(r["agree"] is None and r["no grads"] is None for r in results())


def test_a_differing_gradient_is_named_with_its_size():
    for r in results():
        name, kind, diff = r["grad"]
        assert (name, kind) == ("layers.1.weight", "grad")
        assert diff == pytest.approx(0.25, rel=1e-5)


def test_a_differing_value_is_named():
    for r in results():
        name, kind, diff = r["value"]
        assert (name, kind) == ("layers.2.bias", "value")
        assert diff == pytest.approx(0.5, rel=1e-5)


def test_the_first_difference_wins_gradient_before_value():
    for r in results():
        assert r["first"][:2] == ("layers.0.weight", "grad")


def test_differences_within_atol_are_ignored():
    assert all(r["tolerance"] is None for r in results())


def test_a_missing_gradient_counts_as_zero():
    for r in results():
        assert r["missing"][:2] == ("layers.0.weight", "grad") and r["missing"][2] > 0


def test_every_rank_returns_the_same_answer_and_the_model_is_unchanged():
    a, b = results()
    assert {k: v for k, v in a.items() if not k.endswith("unchanged")} == \
        {k: v for k, v in b.items() if not k.endswith("unchanged")}
    assert all(_same(*v) for r in (a, b) for k, v in r.items() if k.endswith("unchanged"))
