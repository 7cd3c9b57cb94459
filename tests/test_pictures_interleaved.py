"""figures.pictures.interleaved: rank r holds virtual stages r, r + pp, ... (the executor's cut)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib import pipeline as pp  # noqa: E402
from lecture_lib.figures.check import check_figure  # noqa: E402
from lecture_lib.figures.pictures.interleaved import (  # noqa: E402
    CHUNK_COLORS,
    chunk_assignment,
    draw_interleaved,
    draw_interleaved_timeline,
)
from lecture_lib.models import GPT, GPTConfig  # noqa: E402


@pytest.mark.parametrize("p,v,n_layers", [(4, 2, 16), (2, 3, 6), (3, 2, 12)])
def test_rank_r_holds_chunks_r_plus_multiples_of_p(p, v, n_layers):
    schedule = pp.make_schedule("interleaved-1f1b", p, p, v)
    assignment = chunk_assignment(schedule, n_layers)
    per = n_layers // (p * v)
    for rank in range(p):
        assert [stage for _, stage, _ in assignment[rank]] == [rank + c * p for c in range(v)]
        assert [r for *_, r in assignment[rank]] == [
            range((rank + c * p) * per, (rank + c * p + 1) * per) for c in range(v)]
    layers = sorted(i for held in assignment.values() for *_, r in held for i in r)
    assert layers == list(range(n_layers)), "every layer on exactly one rank"


def test_the_executor_cuts_the_same_layers():
    """split_gpt's chunks (what train_stage gives each rank) hold the blocks drawn."""
    cfg = GPTConfig(vocab_size=8, seq_len=4, d_model=8, n_heads=1, n_layers=8)
    schedule = pp.make_schedule("interleaved-1f1b", 2, 2, 2)
    parts = pp.split_gpt(GPT(cfg, 0), 2, 2)
    for rank, held in chunk_assignment(schedule, 8).items():
        for c, stage, r in held:
            assert stage == schedule.stage(rank, c)
            assert list(parts[stage].blocks) == [str(i) for i in r]


def test_unequal_split_and_picture():
    schedule = pp.make_schedule("interleaved-1f1b", 2, 2, 2)
    fig, assignment = draw_interleaved(schedule, 8, layers=(1, 2, 2, 3))
    assert [r for *_, r in assignment[1]] == [range(1, 3), range(5, 8)]
    texts = {t.get_text() for t in fig.findobj(matplotlib.text.Text)}
    assert {"chunk 0\nlayer 0", "chunk 1\nlayers 5-7", "stage 3\nrank 1"} <= texts
    check_figure(fig)
    plt.close(fig)


def test_interleaved_timeline_shades_chunks_apart_and_labels_every_box():
    sim = pp.simulate(pp.make_schedule("interleaved-1f1b", 4, 8, 2), 1, 1, 1)
    fig, ax = plt.subplots(figsize=(11, 2.6))
    drawn = draw_interleaved_timeline(ax, sim.timeline, "interleaved")
    assert {(b["kind"], b["chunk"]) for b in drawn} == {("F", 0), ("F", 1), ("B", 0), ("B", 1)}
    assert all(b["color"] == CHUNK_COLORS[b["kind"], b["chunk"]] for b in drawn)
    assert all(b["text"] == str(b["microbatch"]) for b in drawn)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "F chunk 0", "F chunk 1", "B chunk 0", "B chunk 1"]
    check_figure(fig)
    plt.close(fig)
