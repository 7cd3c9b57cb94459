"""ex06: the 1F1B action lists, checked by the validator and the simulator."""
import pytest

from lecture_lib import pipeline as pp
from lecture_lib.costmodel import peak_microbatches, pipeline_bubble
from lecture_lib.grading import load_exercise

ex = load_exercise("ex06")
POINTS = 10
CASES = [(1, 1), (1, 4), (2, 1), (2, 4), (3, 2), (4, 4), (4, 8), (8, 3), (8, 16)]


def _schedule(p, m):
    actions = ex.one_f_one_b(p, m)
    return pp.Schedule("student-1f1b", p, m, 1, tuple(tuple(a) for a in actions))


@pytest.mark.parametrize("p,m", CASES)
def test_complete_and_deadlock_free(p, m):
    pp.validate(_schedule(p, m), synchronous_sends=True)


@pytest.mark.parametrize("p,m", CASES)
def test_bubble_and_memory_as_theory(p, m):
    sim = pp.simulate(_schedule(p, m), t_forward=1.0, t_backward=2.0)
    assert sim.bubble_fraction == pytest.approx(pipeline_bubble(p, m), abs=1e-9)
    assert sim.peak_activations == [peak_microbatches("1f1b", p, m, r) for r in range(p)], \
        "1F1B holds at most min(m, p - rank) micro-batches on each rank"


@pytest.mark.parametrize("p,m", [(4, 6), (3, 5)])
def test_three_phases(p, m):
    actions = ex.one_f_one_b(p, m)
    for rank, acts in enumerate(actions):
        warmup = min(p - rank - 1, m)
        kinds = "".join(a.kind for a in acts)
        assert kinds.startswith("F" * warmup + ("FB" if warmup < m else "B")), \
            f"rank {rank}: expected {warmup} warm-up forwards, then F B alternating: {kinds}"
        assert [a.microbatch for a in acts if a.kind == "F"] == list(range(m))
        assert [a.microbatch for a in acts if a.kind == "B"] == list(range(m))
        assert kinds.endswith("B" * (warmup + 1))


def test_is_not_gpipe():
    sim = pp.simulate(_schedule(4, 8), 1.0, 2.0)
    assert max(sim.peak_activations) < 8, "all forwards first is GPipe, not 1F1B"
