"""ex10: first_inconsistent names the first parameter whose gradient or value differs.
Run against solutions/ by default; the grader points LECTURE_EXERCISE_PATH at a student's file.

On 3 ranks. Weights: what the exercise is about carries most of the points: every
parameter's gradient and value compared with rank 0's copy element by element (a sum or a
norm per tensor misses differences that keep it), the same answer on every rank."""
import functools

import pytest
import torch
import torch.distributed as dist

from lecture_lib.grading import load_exercise
from lecture_lib.models import ToyMLP, regression_batch

ex = load_exercise("ex10")
POINTS = 10
SIZES = (8, 16, 16, 4)
WORLD = 3
#: the two elements rank 2 changes in each parameter's gradient or value, in turn
PLUS, MINUS = 0.5, -0.25


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
    m = _replica()
    g = m.layers[1].weight.grad.view(-1)              # rank 1 swaps two elements of a gradient
    hi, lo = int(g.argmax()), int(g.argmin())
    out["want swapped grad"] = (g[hi] - g[lo]).item()
    if rank == 1:
        g[hi], g[lo] = g[lo].item(), g[hi].item()
    check("swapped grad", m)
    m = _replica()
    w = m.layers[2].weight.detach()                   # rank 1 reverses a weight's rows
    out["want reversed value"] = (w.flip(0) - w).abs().max().item()
    if rank == 1:
        w.copy_(w.flip(0))
    check("reversed value", m)
    m = _replica()
    if rank in (1, 2):                  # +0.25 on rank 1, -0.25 on rank 2: 0.25 from rank 0
        m.layers[1].weight.grad[1, 1] += 0.25 if rank == 1 else -0.25
    check("two ranks", m)
    m = _replica()
    if rank == 2:                       # the last rank alone
        m.layers[2].weight.grad[3, 2] += 0.75
    check("last rank", m)
    for name, _ in _replica().named_parameters():
        for kind in ("grad", "value"):
            m = _replica()
            if rank == 2:
                p = dict(m.named_parameters())[name]
                t = (p.grad if kind == "grad" else p.detach()).view(-1)
                t[0] += PLUS
                t[-1] += MINUS
            out[f"every {name} {kind}"] = ex.first_inconsistent(m, atol=1e-6)
    return out


@functools.lru_cache(maxsize=None)
def results():
    return ex.run(_cases, WORLD, timeout=90)


def test_replicas_that_agree_give_none():
    assert all(r["agree"] is None and r["no grads"] is None for r in results())


def _found(got, want, what):
    assert got is not None, f"{what}: expected {want}, got None (nothing found)"
    return got


def test_a_differing_gradient_is_named_with_its_size():
    for r in results():
        name, kind, diff = _found(r["grad"], "('layers.1.weight', 'grad', 0.25)",
                                  "rank 1 added 0.25 to one element of layers.1.weight's grad")
        assert (name, kind) == ("layers.1.weight", "grad")
        assert diff == pytest.approx(0.25, rel=1e-5)


def test_a_differing_value_is_named():
    for r in results():
        name, kind, diff = _found(r["value"], "('layers.2.bias', 'value', 0.5)",
                                  "rank 1 took 0.5 from one element of layers.2.bias's value")
        assert (name, kind) == ("layers.2.bias", "value")
        assert diff == pytest.approx(0.5, rel=1e-5)


def test_the_first_difference_wins_gradient_before_value():
    for r in results():
        assert r["first"][:2] == ("layers.0.weight", "grad")


@pytest.mark.weight(0.5)
def test_differences_within_atol_are_ignored():
    assert all(r["tolerance"] is None for r in results())


@pytest.mark.weight(0.5)
def test_a_missing_gradient_counts_as_zero():
    for r in results():
        assert r["missing"][:2] == ("layers.0.weight", "grad") and r["missing"][2] > 0


def test_every_rank_returns_the_same_answer_and_the_model_is_unchanged():
    answers = [{k: v for k, v in r.items() if not k.endswith("unchanged")} for r in results()]
    assert all(a == answers[0] for a in answers), "the ranks returned different answers"
    assert all(_same(*v) for r in results() for k, v in r.items() if k.endswith("unchanged"))


@pytest.mark.weight(4)
def test_every_parameter_gradient_and_value_is_compared():
    """Rank 2 alone changes two elements of one parameter's gradient or value, each in turn:
    each must be named, with the largest element's difference."""
    for rank, r in enumerate(results()):
        for name, _ in ToyMLP(SIZES).named_parameters():
            for kind in ("grad", "value"):
                got = r[f"every {name} {kind}"]
                assert got is not None and got[:2] == (name, kind) and \
                    got[2] == pytest.approx(PLUS, rel=1e-5), (
                    f"rank 2 alone changed two elements of {name}'s {kind} (by {PLUS:+g} and "
                    f"{MINUS:+g}): rank {rank} should return ({name!r}, {kind!r}, {PLUS}), not "
                    f"{got}. Every parameter's gradient and value must be compared with rank "
                    "0's, element by element, and the largest difference returned")


@pytest.mark.weight(3)
def test_differences_that_keep_the_sum_and_norm_are_found():
    """Rank 1 swaps two elements of a gradient, then reverses a weight's rows: the sum and the
    norm of each tensor stay the same, its elements do not."""
    for rank, r in enumerate(results()):
        for case, name, kind in (("swapped grad", "layers.1.weight", "grad"),
                                 ("reversed value", "layers.2.weight", "value")):
            want = r["want " + case]
            got = r[case]
            assert got is not None and got[:2] == (name, kind) and \
                got[2] == pytest.approx(want, rel=1e-5), (
                f"rank 1 {'swapped two elements of' if kind == 'grad' else 'reversed the rows of'}"
                f" {name}'s {kind}, which keeps its sum and its norm: rank {rank} should return "
                f"({name!r}, {kind!r}, {want:.6g}), not {got}. Compare the tensors element by "
                "element, not a sum or a norm of them")


@pytest.mark.weight(1.5)
def test_the_largest_difference_from_rank_0_over_all_ranks():
    """On 3 ranks: ranks 1 and 2 off by +0.25 and -0.25 (0.25 from rank 0, though 0.5 apart);
    then rank 2 alone, by 0.75."""
    for rank, r in enumerate(results()):
        for case, name, want, who in (
                ("two ranks", "layers.1.weight", 0.25, "ranks 1 and 2 differ by +0.25 and -0.25"),
                ("last rank", "layers.2.weight", 0.75, "rank 2 alone differs by 0.75")):
            got = r[case]
            assert got is not None and got[:2] == (name, "grad") and \
                got[2] == pytest.approx(want, rel=1e-5), (
                f"{who} in one element of {name}'s gradient: rank {rank} should return ({name!r}, "
                f"'grad', {want}), not {got}: the largest absolute difference from rank 0, over "
                "all ranks (not the spread between ranks, nor rank 1's difference alone)")
