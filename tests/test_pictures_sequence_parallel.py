"""The sequence-parallel picture draws Korthikanti's regions and the collectives between them."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib import costmodel  # noqa: E402
from lecture_lib.figures.check import check_figure  # noqa: E402
from lecture_lib.figures.pictures.sequence_parallel import block_regions, draw_sequence_parallel  # noqa: E402
from lecture_lib.tensor_parallel import comm as tp_comm  # noqa: E402

SP, TP, AG, RS = "sequence parallel", "tensor parallel", "all_gather", "reduce_scatter"


def test_regions_and_collectives_in_order():
    steps = block_regions(seq=2048, batch=1, hidden=64, tp=4)
    assert [s["kind"] for s in steps] == [SP, AG, TP, RS, SP] * 2
    assert [s["name"].split("\n")[0] for s in steps if s["kind"] == TP] == ["self-attention", "MLP"]
    # the operators are the library's: all-gather entering a TP region, reduce-scatter leaving
    for s in steps:
        if s["kind"] in (AG, RS):
            assert hasattr(tp_comm, s["function"]), s["function"]
    functions = {kind: {s["function"] for s in steps if s["kind"] == kind} for kind in (AG, RS)}
    assert functions == {AG: {"AllGatherFromSequenceParallelRegion"},
                         RS: {"ReduceScatterToSequenceParallelRegion"}}


def test_shapes_split_in_sequence_regions_whole_in_tensor_regions():
    steps = block_regions(seq=2048, batch=2, hidden=64, tp=4)
    for s in steps:
        if s["kind"] in (SP, AG):          # into a LayerNorm/dropout, or into the all-gather
            assert s["shape_in"] == "[s/tp, b, h]" and s["dims_in"] == (512, 2, 64), s
        else:                              # into attention/MLP, or its partial sums into RS
            assert s["shape_in"].startswith("[s, b, h]") and s["dims_in"] == (2048, 2, 64), s


def test_as_many_collectives_as_the_cost_model_counts():
    steps = block_regions(64, 1, 32, 2)
    forward = costmodel.tp_block_comm(1, 64, 32, 2, sequence_parallel=True)["forward"]
    assert sum(s["kind"] == AG for s in steps) == forward["all_gather"][0]
    assert sum(s["kind"] == RS for s in steps) == forward["reduce_scatter"][0]


def test_the_figure_writes_the_shapes_and_is_legible():
    fig, steps = draw_sequence_parallel(seq=2048, batch=1, hidden=64, tp=4)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("[s/tp, b, h]\n[512, 1, 64]") == 7          # 6 arrows in, one out
    assert texts.count("[s, b, h]\n[2048, 1, 64]") == 2
    # the course's names (notebook 04): AG all-gathers in, RS reduce-scatters out; neither is
    # called f or g (Megatron's all-reduce pair) nor the paper's g / g-bar, and the TP size is tp
    assert texts.count("$\\mathrm{RS}$\nfwd: reduce-scatter\nbwd: all-gather") == 2
    assert texts.count("$\\mathrm{AG}$\nfwd: all-gather\nbwd: reduce-scatter") == 2
    paper_names = ("g\n", "f\n", "g-bar", "$\\bar", "$g", "$f")
    assert not any(t.startswith(paper_names) or "s/t," in t or "t = " in t for t in texts)
    assert "tp = 4" in fig.axes[0].get_title()
    check_figure(fig)
    plt.close(fig)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="seq=10 is not divisible"):
        block_regions(10, 1, 8, 4)
    with pytest.raises(ValueError, match="hidden must be"):
        block_regions(8, 1, 0, 2)
