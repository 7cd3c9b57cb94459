"""lecture_lib.pictures.collectives: which rank holds which block before and after each
collective, and that the figure writes exactly those blocks (no process is started)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib.figure_check import check_figure  # noqa: E402
from lecture_lib.pictures.collectives import KINDS, contents, draw, label  # noqa: E402

P = 4


def summed(chunk, p=P):
    return frozenset((r, chunk) for r in range(p))


def test_before_every_rank_holds_its_own_blocks_except_all_gather():
    for kind in KINDS:
        before, _ = contents(kind, P)
        for i in range(P):
            for j in range(P):
                if kind == "all_gather":
                    assert before[i][j] == (frozenset({(i, i)}) if i == j else frozenset())
                else:
                    assert before[i][j] == {(i, j)}, (kind, i, j)


def test_after_reduce_scatter_rank_i_holds_only_the_sum_of_chunk_i():
    _, after = contents("reduce_scatter", P)
    for i in range(P):
        assert after[i][i] == summed(i)
        assert all(not after[i][j] for j in range(P) if j != i)


def test_all_reduce_is_reduce_scatter_then_all_gather():
    _, rs = contents("reduce_scatter", P)
    _, ar = contents("all_reduce", P)
    owned = {j: rs[j][j] for j in range(P)}           # rank j owns chunk j after reduce-scatter
    gathered = [[owned[j] for j in range(P)] for _ in range(P)]  # all-gather of the owned blocks
    assert gathered == ar
    assert all(ar[i][j] == summed(j) for i in range(P) for j in range(P))


def test_broadcast_reduce_all_gather_all_to_all():
    _, bc = contents("broadcast", P, root=2)
    assert all(bc[i][j] == {(2, j)} for i in range(P) for j in range(P))
    before, red = contents("reduce", P, root=1)
    assert red[1] == [summed(j) for j in range(P)]
    assert all(red[i] == before[i] for i in range(P) if i != 1)
    _, ag = contents("all_gather", P)
    assert all(ag[i][j] == {(j, j)} for i in range(P) for j in range(P))
    _, a2a = contents("all_to_all", P)
    assert all(a2a[i][j] == {(j, i)} for i in range(P) for j in range(P))   # a transpose


def test_labels():
    assert label(frozenset({(2, 1)}), P) == "2:1"
    assert label(summed(3), P) == "Σ3"
    assert label(frozenset({(0, 1), (2, 1)}), P) == "0+2:1"
    assert label(frozenset(), P) == ""


def test_bad_input():
    with pytest.raises(ValueError, match="unknown collective"):
        contents("allreduce", P)
    with pytest.raises(ValueError, match="positive"):
        contents("all_reduce", 0)
    with pytest.raises(ValueError, match="root"):
        contents("broadcast", P, root=P)


def test_the_figure_writes_the_blocks_it_computed():
    fig, data = draw(p=P)
    try:
        assert set(data) == set(KINDS)
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert len(axes) == 2 * len(KINDS)
        for n, kind in enumerate(KINDS):
            for ax, buffers in zip(axes[2 * n:2 * n + 2], data[kind]):
                written = sorted(t.get_text() for t in ax.texts)
                expected = sorted(label(b, P) for row in buffers for b in row if b)
                assert written == expected, (kind, ax.get_title())
        reduce_scatter_after = axes[2 * KINDS.index("reduce_scatter") + 1]
        assert {(t.get_text(), int(t.get_position()[0]), int(t.get_position()[1]))
                for t in reduce_scatter_after.texts} == {(f"Σ{i}", i, i) for i in range(P)}
        check_figure(fig)
    finally:
        plt.close(fig)
