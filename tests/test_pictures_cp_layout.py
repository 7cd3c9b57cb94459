"""The layout picture colours each causal query-key pair by the rank that computes it."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib.context_parallel.layout import positions  # noqa: E402
from lecture_lib.figures.check import check_figure  # noqa: E402
from lecture_lib.figures.pictures.cp_layout import causal_owners, draw_cp_layouts, work_per_rank  # noqa: E402


def test_rows_belong_to_the_rank_that_holds_the_query():
    for layout in ("contiguous", "zigzag"):
        owners = causal_owners(16, 2, layout)
        for rank in range(2):
            for q in positions(rank, 2, 16, layout).tolist():
                assert set(owners[q, : q + 1]) == {rank}, (layout, rank, q)
                assert set(owners[q, q + 1:]) <= {-1}, (layout, rank, q)    # masked


def test_zigzag_balances_the_triangle_and_contiguous_does_not():
    contiguous = work_per_rank(causal_owners(32, 4, "contiguous"), 4)
    zigzag = work_per_rank(causal_owners(32, 4, "zigzag"), 4)
    assert sum(contiguous) == sum(zigzag) == 32 * 33 // 2            # the causal triangle
    assert contiguous == sorted(contiguous) and contiguous[0] < contiguous[-1]
    assert len(set(zigzag)) == 1, zigzag


def test_figure_writes_the_work_and_rank_labels():
    fig, grids = draw_cp_layouts(32, 4)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[1].endswith(str(work_per_rank(grids["zigzag"], 4)))
    labels = [t.get_text() for t in fig.axes[1].texts]
    assert sorted(set(labels)) == [f"rank {r}" for r in range(4)] and len(labels) == 7
    check_figure(fig)
    plt.close(fig)


def test_bad_layout_is_refused():
    with pytest.raises(ValueError, match="not divisible by 8"):
        causal_owners(12, 4, "zigzag")
