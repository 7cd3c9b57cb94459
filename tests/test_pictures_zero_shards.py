"""The ZeRO shard picture draws the library's own layout: which rank holds which shard,
between steps (per stage) and moment by moment within a ZeRO-3 step, in the course colours."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from lecture_lib.figures.check import check_figure  # noqa: E402
from lecture_lib.figures.pictures.zero_shards import (  # noqa: E402
    KIND_COLORS,
    KINDS,
    STATE_COLORS,
    draw_shard_states,
    draw_zero_shards,
    holdings,
    shard_states,
    sharded_kinds,
)
from lecture_lib.figures.plots import COLORS  # noqa: E402
from lecture_lib.zero.shards import shard_bounds  # noqa: E402


def blocks(held, rank, kind):
    return [b for b, _, _ in held[rank][kind]]


def test_each_stage_shards_one_more_kind():
    assert [sharded_kinds(s, 4) for s in range(4)] == [
        (), ("optimizer",), ("grads", "optimizer"), ("params", "grads", "optimizer")]
    assert sharded_kinds(3, 1) == ()            # one rank: nothing to shard


@pytest.mark.parametrize("p", [2, 4, 5])
def test_zero1_rank_r_holds_optimizer_shard_r_and_every_parameter(p):
    held = holdings(1, p, 103)
    for r in range(p):
        assert blocks(held, r, "optimizer") == [r], (r, blocks(held, r, "optimizer"))
        assert blocks(held, r, "params") == list(range(p))
        assert blocks(held, r, "grads") == list(range(p))


def test_zero2_and_zero3_and_ddp():
    p = 4
    ddp, z2, z3 = holdings(0, p, 64), holdings(2, p, 64), holdings(3, p, 64)
    for r in range(p):
        assert all(blocks(ddp, r, k) == list(range(p)) for k in KINDS)
        assert blocks(z2, r, "grads") == [r] and blocks(z2, r, "params") == list(range(p))
        assert all(blocks(z3, r, k) == [r] for k in KINDS)


def test_element_ranges_are_the_shard_layout_and_tile_the_tensor():
    p, numel = 4, 10                            # ceil(10/4) = 3: the last shard is short
    held = holdings(3, p, numel)
    for r in range(p):
        (b, lo, hi), = held[r]["params"]
        assert (lo, hi) == shard_bounds(numel, r, p)[1:]
    covered = sorted(e for r in range(p) for _, lo, hi in held[r]["optimizer"]
                     for e in range(lo, hi))
    assert covered == list(range(numel))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        holdings(1, 4, 3)
    with pytest.raises(ValueError):
        holdings(5, 4, 16)


def test_the_figure_draws_what_the_data_says_and_is_legible():
    fig, data = draw_zero_shards(4)
    p = 4
    assert [data[s]["filled"] for s in range(4)] == [3 * p * p, 2 * p * p + p, p * p + 2 * p,
                                                     3 * p]
    assert [data[s]["bytes_per_param"] for s in range(4)] == [16, 7, 5.5, 4]
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[1].startswith("ZeRO-1: 7 Psi bytes")
    filled = [sum(1 for patch in ax.patches if patch.get_facecolor()[:3] != (1, 1, 1))
              for ax in fig.axes]
    assert filled == [data[s]["filled"] for s in range(4)]
    check_figure(fig)
    plt.close(fig)


def test_the_figure_counts_fp32_adam_when_asked_and_refuses_other_precisions():
    fig, data = draw_zero_shards(4, precision="fp32")
    assert [data[s]["bytes_per_param"] for s in range(4)] == [16, 10, 7, 4]   # 4 + 4 + 8
    assert fig.axes[1].get_title().startswith("ZeRO-1: 10 Psi bytes")
    assert fig._suptitle.get_text().startswith("fp32 Adam on 4")
    plt.close(fig)
    with pytest.raises(ValueError, match="precision"):
        draw_zero_shards(4, precision="bf16")


def test_shard_states_replays_events_and_draws():
    events = [("gather", "a", "forward"), ("wait", "a", "forward"), ("full", "a", "forward"),
              ("compute", "a", "forward"), ("gather", "b", "forward"), ("done", "a", "forward"),
              ("free", "a", "forward")]
    states = shard_states(events, ["a", "b"])
    assert [s for _, s in states] == [
        {"a": "in flight", "b": "sharded"}, {"a": "full", "b": "sharded"},
        {"a": "computing", "b": "sharded"}, {"a": "computing", "b": "in flight"},
        {"a": "full", "b": "in flight"}, {"a": "sharded", "b": "in flight"}]
    fig, ax = plt.subplots()
    draw_shard_states(ax, states, ["a", "b"], 2)
    assert len(ax.patches) == 2 * len(states)
    plt.close(fig)


def test_both_views_are_drawn_in_the_course_colours():
    assert KIND_COLORS == {"params": COLORS["compute"], "grads": COLORS["backward"],
                           "optimizer": COLORS["optimizer"]}
    assert STATE_COLORS["full"] == KIND_COLORS["params"]          # held parameters: one colour
    assert len({to_hex(c) for c in STATE_COLORS.values()}) == len(STATE_COLORS)  # told apart
    fig, ax = plt.subplots(figsize=(8, 2))
    states = shard_states([("gather", "a", "forward"), ("full", "a", "forward"),
                           ("compute", "a", "forward"), ("free", "a", "forward")], ["a", "b"])
    draw_shard_states(ax, states, ["a", "b"], 2)
    drawn = {to_hex(patch.get_facecolor()) for patch in ax.patches}
    assert drawn == {to_hex(c) for c in STATE_COLORS.values()}
    fig.tight_layout()
    check_figure(fig)
    plt.close(fig)
