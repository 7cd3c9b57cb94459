"""lecture_lib.study.hybrid_parallelism's plan figure (notebook 08, section 3): one bar per
constraint labelled with its modelled step and layout, Megatron-LM's layouts as dashed lines."""
from dataclasses import replace

import matplotlib
import pytest
from matplotlib.colors import to_rgba

matplotlib.use("Agg")

from lecture_lib.costmodel import A100_CLUSTER, PRESETS  # noqa: E402
from lecture_lib.costmodel.planner import plan, rank_of  # noqa: E402
from lecture_lib.costmodel.steptime import Parallelism  # noqa: E402
from lecture_lib.dims import ParallelDims, Recipe  # noqa: E402
from lecture_lib.figures.check import check_figure  # noqa: E402
from lecture_lib.study import hybrid_parallelism as study  # noqa: E402


@pytest.fixture(scope="module")
def plans():
    return plan(PRESETS["GPT-3 175B"], A100_CLUSTER, 1536)


def test_plan_figure_labels_each_bar_with_its_step_and_layout(plans):
    lecture = Parallelism(ParallelDims(dp=8, tp=8, pp=16), Recipe(microbatch_size=1, zero_stage=1),
                          recompute="full")
    full = next(p for p in plans if p.parallelism.recompute == "full")
    bests = {"fastest of all": plans[0], "recomputing every layer": full}
    megatron = {"as run": plans[rank_of(plans, lecture) - 1],
                "selective": plans[rank_of(plans, replace(lecture, recompute="selective")) - 1]}
    fig = study.plan_figure(bests, megatron, len(plans), "GPT-3 175B")
    check_figure(fig)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert [b.get_width() for b in ax.patches] == [plans[0].seconds, full.seconds]
    assert texts[0] == f"{plans[0].seconds:.1f} s (+0%): {study.layout_text(plans[0])}"
    assert texts[1].startswith(f"{full.seconds:.1f} s (+{full.seconds / plans[0].seconds - 1:.0%})")
    assert [line.get_xdata()[0] for line in ax.lines] == [p.seconds for p in megatron.values()]
    assert f"{full.seconds / plans[0].seconds - 1:.0%} slower" in ax.get_title()
    assert "modelled" in ax.get_xlabel()
    # the key: green keeps both decisions (the fastest), red breaks one (recomputing every layer)
    assert [b.get_facecolor() for b in ax.patches] == [to_rgba("#55A868"), to_rgba("#C44E52")]
    key = [t.get_text() for t in fig.legends[0].get_texts()]
    assert key == ["keeps both decisions", "breaks one"]


def test_keeps_decisions_is_tp_inside_a_node_and_no_full_recompute(plans):
    assert study.keeps_decisions(plans[0])
    assert not study.keeps_decisions(next(p for p in plans if p.parallelism.recompute == "full"))
    assert not study.keeps_decisions(next(p for p in plans if p.parallelism.dims.tp > 1
                                          and p.parallelism.inner != "tp"))


def test_layout_text_names_every_axis_and_the_zero_stage(plans):
    p = plans[0]
    d = p.parallelism.dims
    zero = p.parallelism.recipe.zero_stage
    assert study.layout_text(p) == f"dp {d.dp} · pp {d.pp} · tp {d.tp}, ZeRO-{zero}"
