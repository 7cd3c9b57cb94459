"""The step model's assumptions as parameters: selective recomputation's FLOPs and a share of
the data-parallel collectives no backward hides. The defaults are the course's model, unchanged;
each knob moves only what it names."""
from dataclasses import replace

import pytest

from lecture_lib.costmodel import PRESETS
from lecture_lib.costmodel.planner import plan
from lecture_lib.costmodel.steptime import (
    A100_CLUSTER,
    ASSUMED,
    Assumptions,
    Parallelism,
    grad_sync_seconds,
    group_link,
    selective_recompute_share,
    step_time,
)
from lecture_lib.dims import ParallelDims, Recipe

GPT3 = PRESETS["GPT-3 175B"]
LAYOUT = ParallelDims(dp=8, tp=8, pp=16)


def par(recompute, zero_stage=1, overlap=True, dims=LAYOUT):
    return Parallelism(dims, Recipe(microbatch_size=1, zero_stage=zero_stage), recompute=recompute,
                       dp_overlap=overlap)


def test_the_defaults_are_the_course_model():
    assert ASSUMED == Assumptions()
    assert ASSUMED.selective_extra == 0 and ASSUMED.dp_exposed_share == 0
    for rc in ("none", "selective", "full"):
        assert step_time(GPT3, par(rc), A100_CLUSTER, 1536, assumptions=ASSUMED) == \
            step_time(GPT3, par(rc), A100_CLUSTER, 1536)


def test_selective_recomputation_share_is_core_attention_over_a_step():
    # core attention, 4 b s^2 h FLOPs forward per layer, against a layer's training FLOPs,
    # 3 x (24 b s h^2 + 4 b s^2 h): s / (18 h + 3 s)
    s, h = GPT3.seq_len, GPT3.hidden
    assert selective_recompute_share(GPT3) == pytest.approx(s / (18 * h + 3 * s), rel=1e-12)
    assert 0.008 < selective_recompute_share(GPT3) < 0.01          # GPT-3 175B: about 0.9%


def test_selective_extra_charges_only_selective_plans():
    extra = Assumptions(selective_extra=0.05)
    for rc, grows in (("none", False), ("selective", True), ("full", False)):
        base = step_time(GPT3, par(rc), A100_CLUSTER, 1536)
        more = step_time(GPT3, par(rc), A100_CLUSTER, 1536, assumptions=extra)
        assert more.compute == pytest.approx(base.compute * (1.05 if grows else 1), rel=1e-12), rc
        assert more.tp_comm == base.tp_comm and more.pp_comm == base.pp_comm


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_exposed_share_sets_a_floor_on_the_data_parallel_wait(stage):
    dims = ParallelDims(dp=128, tp=8, pp=1)
    p = par("full", stage, dims=dims)
    m = step_time(GPT3, p, A100_CLUSTER, 1536).microbatches
    total = grad_sync_seconds(GPT3.num_params, 2, p, 128, group_link(p, "dp", A100_CLUSTER), m)
    base = step_time(GPT3, p, A100_CLUSTER, 1536).dp_comm
    quarter = step_time(GPT3, p, A100_CLUSTER, 1536, assumptions=Assumptions(dp_exposed_share=0.25))
    assert quarter.dp_comm == pytest.approx(max(base, total / 4), rel=1e-12)
    every = step_time(GPT3, p, A100_CLUSTER, 1536, assumptions=Assumptions(dp_exposed_share=1.0))
    assert every.dp_comm == pytest.approx(
        step_time(GPT3, replace(p, dp_overlap=False), A100_CLUSTER, 1536).dp_comm, rel=1e-12)


def test_the_planner_passes_the_assumptions_on():
    base = plan(GPT3, A100_CLUSTER, 1536, top=50)
    stressed = plan(GPT3, A100_CLUSTER, 1536, top=50, assumptions=Assumptions(selective_extra=0.05))
    sel = next(p for p in base if p.parallelism.recompute == "selective")
    again = next(p for p in stressed if p.parallelism == sel.parallelism)
    assert again.time.compute == pytest.approx(1.05 * sel.time.compute, rel=1e-12)


@pytest.mark.parametrize("kwargs", [{"selective_extra": -0.01}, {"selective_extra": 0.5},
                                    {"dp_exposed_share": -0.1}, {"dp_exposed_share": 1.5}])
def test_bad_assumptions_are_refused(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Assumptions(**kwargs)


def test_step_time_refuses_what_is_not_assumptions():
    with pytest.raises(TypeError, match="assumptions"):
        step_time(GPT3, par("none"), A100_CLUSTER, 1536, assumptions={"selective_extra": 0.05})
