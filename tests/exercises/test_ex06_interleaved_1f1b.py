"""ex06: interleaved 1F1B as action lists, checked by the validator and the simulator."""
import pytest

from lecture_lib import pipeline as pp
from lecture_lib.costmodel import pipeline_bubble
from lecture_lib.grading import load_exercise

ex = load_exercise("ex06")
POINTS = 10
CASES = [(1, 2, 2), (2, 2, 2), (2, 4, 2), (2, 4, 3), (3, 6, 2), (4, 4, 2), (4, 8, 2), (4, 8, 4)]


def _schedule(p, m, v):
    actions = ex.interleaved_1f1b(p, m, v)
    if len(actions) != p:
        raise AssertionError(f"expected a list of {p} action lists (one per rank), "
                             f"got {len(actions)}")
    return pp.Schedule("student interleaved-1f1b", p, m, v, tuple(tuple(a) for a in actions))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_complete_and_deadlock_free(case):
    pp.validate(_schedule(*case))          # names the rank, the action and what is missing or stuck


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bubble_is_the_interleaved_formula(case):
    p, m, v = case
    schedule = pp.validate(_schedule(*case))
    got = pp.simulate(schedule, t_forward=1.0, t_backward=2.0)
    want = pp.simulate(pp.make_schedule("interleaved-1f1b", p, m, v), 1.0, 2.0)
    lines = [f"rank {r}: idle share expected {e:.4f}, got {g:.4f}"
             for r, (e, g) in enumerate(zip(want.idle_fraction, got.idle_fraction))
             if abs(e - g) > 1e-9]
    assert got.bubble_fraction == pytest.approx(pipeline_bubble(p, m, v), abs=1e-9), (
        f"p={p}, m={m}, v={v}: bubble expected (p-1)/(vm+p-1) = {pipeline_bubble(p, m, v):.4f}, "
        f"got {got.bubble_fraction:.4f}\n" + "\n".join(lines))


def _most_held(p, m, v, rank):
    """1F1B's rule, in micro-batches (a chunk counts 1/v): the warm-up forwards plus one."""
    warmup = 2 * (p - rank - 1) + (v - 1) * p
    return min(m, (warmup + 1) / v)


@pytest.mark.weight(2)
@pytest.mark.parametrize("case", [(2, 2, 2), (4, 4, 2), (3, 3, 2), (2, 8, 2), (4, 16, 2),
                                  (4, 8, 4)], ids=str)
def test_holds_no_more_activations_than_1f1b_allows(case):
    """Also at m = p, where the first ranks' warm-up covers every forward: they hold all m,
    the later ranks fewer (holding all m on every rank, as GPipe does, fails here)."""
    p, m, v = case
    sim = pp.simulate(pp.validate(_schedule(*case)), 1.0, 2.0)
    over = [(r, peak, _most_held(p, m, v, r)) for r, peak in enumerate(sim.peak_activations)
            if peak > _most_held(p, m, v, r) + 1e-9]
    assert not over, "\n".join(
        f"rank {r}: holds the activations of {peak:g} micro-batches at once (simulate's "
        f"peak_activations: a chunk counts 1/{v}), more than 1F1B's rule allows, "
        f"min(m, (w + 1)/v) = {most:g} with w = 2(p-r-1) + (v-1)p warm-up forwards"
        + (f"; all {m}: every forward before any backward is GPipe" if peak >= m else "")
        for r, peak, most in over)


@pytest.mark.weight(0.5)
@pytest.mark.parametrize("case", [(2, 3, 2), (4, 6, 2), (2, 4, 1)], ids=str)
def test_rejects_what_cannot_be_interleaved(case):
    """chunks < 2, or micro-batches not a multiple of the stages, raise ValueError."""
    pp.validate(_schedule(2, 2, 2))            # a valid case works (so raising always fails)
    with pytest.raises(ValueError):
        ex.interleaved_1f1b(*case)
