"""ex04: the per-device memory formula, against the ZeRO paper, Korthikanti et al.
and lecture_lib.costmodel. Most of the points are for sizes that no test lists (drawn from a
seeded generator and checked against lecture_lib.costmodel), so a table of the listed answers
earns little."""
import random

import pytest

from lecture_lib import costmodel
from lecture_lib.grading import load_exercise

ex = load_exercise("ex04")
POINTS = 10
GPT3 = dict(num_params=175e9, layers=96, hidden=12288, heads=96, seq_len=2048, microbatch_size=1)


def _states(m):
    return m["params"] + m["grads"] + m["optimizer"]


def test_zero_paper_figure_1():
    """The model states of the ZeRO paper's Figure 1 (7.5B parameters, 64 GPUs)."""
    got = [_states(ex.memory_per_device(7.5e9, 32, 4096, 32, 1024, 1, dp=64, zero_stage=s)) / 1e9
           for s in range(4)]
    want = [120.0, 31.4, 16.6, 1.9]
    assert [round(g, 1) for g in got] == want, (
        f"model states of 7.5B parameters on 64 GPUs, ZeRO stages 0-3 (GB): expected {want}, "
        f"got {[round(g, 1) for g in got]}")


@pytest.mark.parametrize("kw", [
    dict(), dict(tp=8), dict(tp=8, pp=8), dict(dp=16, zero_stage=1), dict(dp=8, zero_stage=3, tp=4),
    dict(tp=8, recompute="selective"), dict(recompute="full", pp=4), dict(microbatch_size=4, tp=2),
])
def test_agrees_with_the_library(kw):
    """Listed GPT-3 layouts agree with lecture_lib.costmodel."""
    kw = {**GPT3, **kw}
    got = ex.memory_per_device(**kw)
    shape = costmodel.TransformerShape("GPT-3", kw["layers"], kw["hidden"], kw["heads"], 50257,
                                       kw["seq_len"], kw["num_params"])
    want = costmodel.memory_per_device(
        shape, dp=kw.get("dp", 1), tp=kw.get("tp", 1), pp=kw.get("pp", 1),
        zero_stage=kw.get("zero_stage", 0), microbatch_size=kw["microbatch_size"],
        recompute=kw.get("recompute", "none"))
    for kind in ("params", "grads", "optimizer", "activations", "total"):
        assert got[kind] == pytest.approx(want[kind], rel=1e-9), (
            f"{kind} with {kw}: expected {want[kind] / 1e9:.4f} GB, got {got[kind] / 1e9:.4f} GB")


def test_gpt3_activations_per_layer():
    """One GPT-3 layer: 114 s b h bytes, 2 s b h under full recomputation."""
    # Korthikanti et al. 2022: for GPT-3, 5as/h = 80, larger than the 34 of everything else
    one_layer = dict(GPT3, layers=1)
    sbh = 2048 * 12288
    got = ex.memory_per_device(**one_layer)["activations"]
    assert got == pytest.approx(sbh * 114), (
        f"one GPT-3 layer: expected 114 s b h bytes, got {got / sbh:.2f} s b h")
    got = ex.memory_per_device(**one_layer, recompute="full")["activations"]
    assert got == 2 * sbh, f"full recomputation: expected 2 s b h bytes, got {got / sbh:.2f} s b h"


@pytest.mark.weight(0.5)
@pytest.mark.parametrize("bad", [dict(zero_stage=4), dict(recompute="half"), dict(dp=0),
                                 dict(hidden=-1)])
def test_bad_input(bad):
    """A bad ZeRO stage, recompute mode or size is a ValueError."""
    with pytest.raises(ValueError):
        ex.memory_per_device(**{**GPT3, **bad})


def _unlisted_sizes(n=24, seed=20240):
    """Sizes no other test lists: any parallel layout that costmodel accepts (layers split
    into pp stages, heads over tp), every ZeRO stage and recompute mode."""
    rng = random.Random(seed)
    for _ in range(n):
        tp, pp = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 3, 4])
        heads = tp * rng.randint(1, 12)
        yield dict(num_params=rng.randint(1, 3000) * 1e7 + rng.randint(1, 10**6),
                   layers=pp * rng.randint(1, 24), hidden=heads * rng.choice([64, 80, 128]),
                   heads=heads, seq_len=rng.choice([256, 1000, 2048, 4096]),
                   microbatch_size=rng.randint(1, 8), dp=rng.choice([1, 2, 3, 8, 64]), tp=tp,
                   pp=pp, zero_stage=rng.randint(0, 3),
                   recompute=rng.choice(["none", "selective", "full"]))


def _library(kw):
    shape = costmodel.TransformerShape("unlisted", kw["layers"], kw["hidden"], kw["heads"],
                                       50257, kw["seq_len"], kw["num_params"])
    return costmodel.memory_per_device(
        shape, dp=kw["dp"], tp=kw["tp"], pp=kw["pp"], zero_stage=kw["zero_stage"],
        microbatch_size=kw["microbatch_size"], recompute=kw["recompute"])


@pytest.mark.weight(16)
def test_agrees_with_the_library_on_sizes_the_tests_do_not_list():
    """The formula itself: 24 layouts drawn at random (seeded), each kind of bytes."""
    cases = list(_unlisted_sizes())
    got = ex.call(lambda cs: [ex.memory_per_device(**kw) for kw in cs], cases)
    wrong = []
    for kw, g in zip(cases, got):
        want, g = _library(kw), g if isinstance(g, dict) else {}
        bad = [k for k in ("params", "grads", "optimizer", "activations", "total")
               if g.get(k) != pytest.approx(want[k], rel=1e-9)]
        if bad:
            wrong.append(f"{kw}: " + ", ".join(
                f"{k} expected {want[k] / 1e9:.4f} GB, got {_gb(g.get(k))}"
                for k in bad))
    if wrong:                            # (not assert: pytest would print the whole list)
        raise AssertionError(
            f"on sizes the tests do not list, {len(wrong)} of {len(cases)} layouts are wrong "
            "(the formula must hold for any sizes, not only the listed ones); the first:\n"
            + "\n".join(wrong[:3]))


def _gb(value):
    return f"{value / 1e9:.4f} GB" if isinstance(value, (int, float)) else repr(value)
