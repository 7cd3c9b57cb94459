"""figures.pictures.all_to_all: the rows drawn between ranks are the library's dispatch plan."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib.figures.check import check_figure  # noqa: E402
from lecture_lib.figures.pictures.all_to_all import dispatch_example, draw_all_to_all  # noqa: E402


@pytest.mark.parametrize("p,experts,k,cf", [(4, 4, 1, None), (2, 4, 2, None), (4, 8, 2, 0.5)])
def test_counts_match_the_routing_and_both_ends_agree(p, experts, k, cf):
    ex = dispatch_example(p, 6, experts, k, cf, seed=p + k)
    per = experts // p
    for r in range(p):
        kept = ex["expert"][r][ex["keep"][r]]                 # this rank's kept slots' experts
        by_rank = [int((kept // per == s).sum()) for s in range(p)]
        assert ex["send"][r] == by_rank, f"rank {r}: sends {ex['send'][r]}, routed {by_rank}"
        for s in range(p):
            assert ex["recv"][s][r] == ex["send"][r][s], (r, s)
    kept_slots = sum(int(ex["keep"][r].sum()) for r in range(p))
    assert sum(map(sum, ex["send"])) == kept_slots
    if cf is None:
        assert kept_slots == p * 6 * k, "no capacity: nothing dropped"
    else:
        assert kept_slots < p * 6 * k, "capacity factor 0.5 drops slots"


def test_picture_draws_the_plan():
    ex = dispatch_example()
    fig, drawn = draw_all_to_all(ex)
    p = len(ex["send"])
    expected = [(r, s, ex["send"][r][s]) for r in range(p) for s in range(p) if ex["send"][r][s]]
    assert drawn["dispatch"] == expected
    assert sorted(drawn["combine"]) == sorted((s, r, n) for r, s, n in expected), \
        "combine sends each result back along its path, reversed"
    texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    assert sorted(t for t in texts if t.isdigit()) == sorted([str(n) for *_, n in expected] * 2)
    check_figure(fig)
    plt.close(fig)


def test_bad_split():
    with pytest.raises(ValueError, match="evenly"):
        dispatch_example(p=3, num_experts=4)


@pytest.mark.parametrize("p,experts,seed", [(3, 6, 0), (4, 4, 0), (4, 8, 3)])
def test_counts_do_not_overlap(p, experts, seed):
    fig, _ = draw_all_to_all(dispatch_example(p, 4, experts, 1, seed=seed))
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text().isdigit()]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (ax.get_title(), a, b)
    plt.close(fig)
