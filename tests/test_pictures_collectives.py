"""lecture_lib.figures.pictures.collectives: which rank holds which block before and after each
collective, and that the figure writes exactly those blocks (no process is started)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib.figures.check import check_figure  # noqa: E402
from lecture_lib.figures.pictures.collectives import (  # noqa: E402
    KINDS,
    contents,
    draw,
    label,
    panel_origin,
)

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


def written_in(blocks, origin):
    """(text, column, row) of the block labels inside the panel whose top-left is origin."""
    x0, y0 = origin
    found = set()
    for t in blocks:
        x, y = t.get_position()
        if 0 <= x - x0 < P and 0 <= y - y0 < P:
            found.add((t.get_text(), int(x - x0), int(y - y0)))
    return found


def test_the_figure_writes_the_blocks_it_computed():
    fig, data = draw(p=P)
    try:
        assert set(data) == set(KINDS)
        (ax,) = fig.axes
        blocks = [t for t in ax.texts if t.get_gid() == "block"]
        for n, kind in enumerate(KINDS):
            for after, buffers in enumerate(data[kind]):
                expected = {(label(b, P), j, i) for i, row in enumerate(buffers)
                            for j, b in enumerate(row) if b}
                assert written_in(blocks, panel_origin(n, bool(after), P)) == expected, kind
        rs_after = panel_origin(KINDS.index("reduce_scatter"), True, P)
        assert written_in(blocks, rs_after) == {(f"Σ{i}", i, i) for i in range(P)}
        assert len(blocks) == sum(1 for b, a in data.values() for buf in (b, a)
                                  for row in buf for x in row if x)
        check_figure(fig)
    finally:
        plt.close(fig)
