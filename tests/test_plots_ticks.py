"""figures.plots.plain_log_ticks: a log axis labelled with plain numbers ("50", not "5x10^1"),
the one helper notebooks 00 and 05 use (issue 28). Drawing only; no ranks run."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib.figures import plots  # noqa: E402
from lecture_lib.figures.check import check_figure  # noqa: E402


def _labels(axis):
    axis.axes.figure.canvas.draw()
    return [t.get_text() for t in axis.get_ticklabels() if t.get_visible()]


def _log_axes(ys):
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 2, 3][: len(ys)], ys, "o-")
    ax.set_yscale("log")
    return fig, ax


def test_one_two_five_ticks_within_the_range_as_plain_numbers():
    fig, ax = _log_axes([35, 1130])
    ticks = plots.plain_log_ticks(ax.yaxis, 35, 1130)
    assert ticks == [50, 100, 200, 500, 1000]
    assert _labels(ax.yaxis) == ["50", "100", "200", "500", "1000"]
    assert list(ax.yaxis.get_minorticklocs()) == []            # no minor ticks, no minor labels
    check_figure(fig)
    plt.close(fig)


def test_outer_labels_both_ends_and_sets_the_limits():
    fig, ax = _log_axes([0.6, 40])
    ticks = plots.plain_log_ticks(ax.yaxis, 0.6, 40, outer=True)
    assert ticks == [0.5, 1, 2, 5, 10, 20, 50]
    assert ax.get_ylim() == (0.5, 50)
    ax.plot([1, 2], [0.7, 30])                                  # later data: the limits stay
    assert ax.get_ylim() == (0.5, 50)
    assert _labels(ax.yaxis) == ["0.5", "1", "2", "5", "10", "20", "50"]
    plt.close(fig)


def test_other_mantissas_and_base_two():
    fig, ax = _log_axes([0.3, 110])
    assert plots.plain_log_ticks(ax.yaxis, 0.3, 110, mantissas=(1, 3)) == [0.3, 1, 3, 10, 30, 100]
    assert plots.plain_log_ticks(ax.yaxis, 0.12, 4.1, mantissas=(1,), base=2) == \
        [0.125, 0.25, 0.5, 1, 2, 4]
    assert _labels(ax.yaxis) == ["0.125", "0.25", "0.5", "1", "2", "4"]
    plt.close(fig)


def test_default_range_is_the_view_and_large_values_stay_plain():
    fig, ax = _log_axes([2e3, 3e6])
    ax.set_ylim(1e3, 5e6)
    ticks = plots.plain_log_ticks(ax.yaxis, mantissas=(1,))
    assert ticks == [1e3, 1e4, 1e5, 1e6]
    assert _labels(ax.yaxis) == ["1000", "10000", "100000", "1000000"]
    plt.close(fig)


@pytest.mark.parametrize("lo, hi", [(0, 10), (-1, 10), (10, 1)])
def test_a_range_a_log_axis_cannot_show_is_refused(lo, hi):
    fig, ax = _log_axes([1, 10])
    with pytest.raises(ValueError, match="0 < lo <= hi"):
        plots.plain_log_ticks(ax.yaxis, lo, hi)
    plt.close(fig)
