"""figures.check finds small fonts and legends over data, and passes a legible figure."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib.figures.check import check_figure, problems  # noqa: E402


def test_a_legend_over_bars_is_found_and_one_outside_passes():
    fig, ax = plt.subplots()
    ax.bar([0, 1], [3, 3], label="a")
    ax.legend(loc="upper left")
    assert problems(fig) == ["the legend covers data of 'axes 0'"]
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    assert problems(fig) == []
    plt.close(fig)


def test_a_legend_over_a_line_segment_is_found():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 1], label="flat")         # the segment, not a vertex, runs under it
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper center")
    assert problems(fig)
    plt.close(fig)


def test_gantt_spans_and_scatter_markers_count_as_data():
    fig, ax = plt.subplots()
    ax.broken_barh([(0, 1), (2, 1)], (0, 1), label="F")
    ax.legend(loc="lower left")
    assert problems(fig)
    fig2, ax2 = plt.subplots()
    ax2.scatter([0, 1], [1, 1], label="s")
    ax2.set_ylim(0, 1.05)
    ax2.legend(loc="upper left")
    assert problems(fig2)
    plt.close(fig)
    plt.close(fig2)


def test_small_text_is_named_and_check_figure_raises():
    fig, ax = plt.subplots()
    ax.set_title("tiny", fontsize=6)
    assert problems(fig) == ["text 'tiny' is 6.0 pt (< 8.0 pt)"]
    with pytest.raises(AssertionError, match="tiny"):
        check_figure(fig)
    ax.set_title("big enough", fontsize=8)
    check_figure(fig)
    plt.close(fig)
