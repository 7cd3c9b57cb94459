"""figures.plots.plot_timeline: every pipeline Gantt chart writes the micro-batch in its boxes and
tells interleaved chunks apart (issue 17). No ranks run: simulated timelines only."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib import pipeline as pp  # noqa: E402
from lecture_lib.figures import plots  # noqa: E402
from lecture_lib.figures.check import check_figure  # noqa: E402


def _draw(schedule, **kw):
    fig, ax = plt.subplots(figsize=(12, 2.5))
    drawn = plots.plot_timeline(ax, pp.simulate(schedule, 1.0, 1.0, 1.0).timeline,
                                unit="s", **kw)
    fig.tight_layout()
    return fig, ax, drawn


def test_each_box_shows_its_microbatch():
    schedule = pp.make_schedule("1f1b", 2, 4)
    fig, ax, drawn = _draw(schedule, labels=True, legend_outside=True)
    texts = [t.get_text() for t in ax.texts]
    assert "3" in texts and sorted(set(texts)) == ["0", "1", "2", "3"]
    assert len(drawn) == sum(len(a) for a in schedule.actions)
    for box in drawn:
        assert box["text"] == str(box["microbatch"]), box      # every box fits at this size
    for rank, acts in enumerate(schedule.actions):             # row r, in program order
        row = [b for b in drawn if b["row"] == rank]
        assert [(b["kind"], b["microbatch"]) for b in row] == [(a.kind, a.microbatch)
                                                               for a in acts]
    check_figure(fig)
    plt.close(fig)


def test_a_box_too_narrow_gets_no_text():
    fig, ax = plt.subplots(figsize=(2, 1.5))
    drawn = plots.plot_timeline(ax, pp.simulate(pp.make_schedule("gpipe", 2, 16), 1.0, 1.0)
                                .timeline, unit="s", labels=True, legend=False)
    assert all(b["text"] is None for b in drawn) and not ax.texts
    assert ax.get_legend() is None
    plt.close(fig)


def test_interleaved_chunks_have_their_own_shade_and_legend_entry():
    schedule = pp.make_schedule("interleaved-1f1b", 2, 2, 2)
    fig, ax, drawn = _draw(schedule, labels=True, legend_outside=True)
    colors = {(b["kind"], b["chunk"]): b["color"] for b in drawn}
    assert set(colors) == {("F", 0), ("F", 1), ("B", 0), ("B", 1)}
    assert len(set(colors.values())) == 4, "each (kind, chunk) its own colour"
    assert colors[("F", 0)] == plots.shade(plots.COLORS["F"], 0, 2)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["F chunk 0", "F chunk 1", "B chunk 0", "B chunk 1"]
    check_figure(fig)                                          # the legend is outside
    plt.close(fig)


def test_plain_spans_unchanged():
    fig, ax = plt.subplots()
    drawn = plots.plot_timeline(ax, {0: [("comm", 0.0, 1.0)], 1: [("compute", 0.5, 2.0)]})
    assert [(b["row"], b["kind"], b["microbatch"]) for b in drawn] == [(0, "comm", None),
                                                                       (1, "compute", None)]
    assert drawn[0]["color"] == plots.COLORS["comm"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["comm", "compute"]
    plt.close(fig)


@pytest.mark.parametrize("chunks", [1, 2, 4])
def test_shade_keeps_chunk_zero_and_lightens_the_rest(chunks):
    base = plots.shade("#4C72B0", 0, chunks)
    assert base == pytest.approx(matplotlib.colors.to_rgb("#4C72B0"))
    lighter = [sum(plots.shade("#4C72B0", c, chunks)) for c in range(chunks)]
    assert lighter == sorted(lighter) and len(set(lighter)) == chunks


def test_the_schedule_explorers_chart_is_numbered_and_legible():
    from lecture_lib.figures.widgets.pipeline import schedule_figure  # noqa: PLC0415  imports ipywidgets
    fig, sim = schedule_figure("interleaved-1f1b", 4, 8, 2)
    ax = fig.axes[0]
    assert ax.get_title().startswith("interleaved-1f1b: pp=4, m=8, v=2;")    # pp: stages
    assert "7" in {t.get_text() for t in ax.texts}
    assert "F chunk 1" in [t.get_text() for t in ax.get_legend().get_texts()]
    check_figure(fig)
    plt.close(fig)


def _overlapped():
    """Two ranks whose all-reduces run during the backward pass (rank 1: one span more)."""
    return {0: [("compute", 0.0, 3.0), ("comm", 1.0, 2.0), ("comm", 2.5, 4.0)],
            1: [("compute", 0.0, 2.0), ("idle", 2.0, 2.5), ("compute", 2.5, 3.5),
                ("comm", 1.5, 3.0), ("optimizer", 4.0, 4.5)]}


def test_compute_and_communication_each_land_on_their_own_lane():
    fig, ax = plt.subplots(figsize=(7, 2.4))
    timelines = _overlapped()
    drawn = plots.plot_timeline(ax, timelines, unit="s", legend_outside=True)
    fig.tight_layout()
    assert [(b["row"], b["kind"]) for b in drawn] == [(r, sp[0]) for r, spans in timelines.items()
                                                      for sp in spans]
    for box in drawn:                                      # comm below, everything else above
        assert box["lane"] == ("comm" if box["kind"] == "comm" else "compute"), box
    fig.canvas.draw()
    bars = {id(b): patch for b, patch in zip(drawn, ax.patches)}
    for row in (0, 1):                                     # on screen: the lanes never overlap,
        compute = [bars[id(b)].get_window_extent() for b in drawn
                   if b["row"] == row and b["lane"] == "compute"]
        comm = [bars[id(b)].get_window_extent() for b in drawn
                if b["row"] == row and b["lane"] == "comm"]
        assert min(e.y0 for e in compute) > max(e.y1 for e in comm)   # compute lane on top
        band = [e for e in compute + comm]
        other = [bars[id(b)].get_window_extent() for b in drawn if b["row"] != row]
        assert all(e.y1 < min(x.y0 for x in band) or e.y0 > max(x.y1 for x in band)
                   for e in other)                         # nor does a rank's band another's
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    lanes = [t.get_text() for t in ax.get_yticklabels(minor=True)]
    assert ticks == ["rank 0", "rank 1"] and lanes == ["compute", "comm"] * 2
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["compute", "comm", "idle",
                                                                   "optimizer"]
    check_figure(fig)
    plt.close(fig)


def test_overlap_stays_visible():
    """The comm span drawn during the compute span does not cover it: both keep their area."""
    fig, ax = plt.subplots()
    drawn = plots.plot_timeline(ax, {0: [("compute", 0.0, 2.0), ("comm", 0.5, 1.5)]})
    compute, comm = drawn
    assert comm["y"] - compute["y"] >= (compute["height"] + comm["height"]) / 2
    plt.close(fig)


def test_other_communication_kinds_can_be_named():
    spans = {0: [("route", 0.0, 1.0), ("dispatch", 1.0, 2.0), ("experts", 2.0, 3.0)]}
    fig, ax = plt.subplots()
    assert {b["lane"] for b in plots.plot_timeline(ax, spans)} == {None}   # no comm kind: one bar
    plt.close(fig)
    fig, ax = plt.subplots()
    drawn = plots.plot_timeline(ax, spans, comm_kinds=("dispatch",))
    assert [b["lane"] for b in drawn] == ["compute", "comm", "compute"]
    plt.close(fig)


def test_rows_already_split_by_the_caller_stay_one_bar_high():
    """02's and 05's figures pass one row of compute and one of comm per variant."""
    lines = {"flat: compute": [("compute", 0.0, 2.0), ("idle", 2.0, 2.5)],
             "flat: comm": [("comm", 2.0, 2.5)]}
    fig, ax = plt.subplots()
    drawn = plots.plot_timeline(ax, lines, unit="us")
    assert [(b["row"], b["lane"], b["height"]) for b in drawn] == [(0, None, 0.7), (0, None, 0.7),
                                                                   (1, None, 0.7)]
    assert [t.get_text() for t in ax.get_yticklabels()] == list(lines)
    plt.close(fig)


def test_boxes_are_outlined_in_white_unless_told_otherwise():
    spans = {0: [("compute", 0.0, 1.0)], 1: [("compute", 0.5, 2.0)]}
    for edge, want in (({}, (1.0, 1.0, 1.0, 1.0)), ({"edgecolor": "none"}, (0.0, 0.0, 0.0, 0.0))):
        fig, ax = plt.subplots()
        plots.plot_timeline(ax, spans, unit="s", **edge)
        assert [tuple(p.get_edgecolor()) for p in ax.patches] == [want, want]
        plt.close(fig)
