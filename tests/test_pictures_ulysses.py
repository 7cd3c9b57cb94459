"""figures.pictures.ulysses: the library's seq_to_heads, run on ranks, turns tokens into heads."""
import matplotlib.pyplot as plt
import numpy as np
import pytest

import lecture_lib
from lecture_lib.figures.check import check_figure
from lecture_lib.figures.pictures.ulysses import draw_ulysses, holdings_rank, owner_grids


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_each_rank_ends_with_every_token_of_its_heads(layout):
    cp, heads, tokens = 4, 8, 16
    results = lecture_lib.run(holdings_rank, cp, heads, tokens, layout, timeout=120)
    grids = owner_grids(results, heads, tokens)
    assert (grids["after"] == np.arange(heads)[:, None] // (heads // cp)).all()   # rows: heads
    if layout == "contiguous":                                     # columns: each rank's tokens
        assert (grids["before"] == np.arange(tokens)[None, :] // (tokens // cp)).all()
    assert all((grids["before"][:, t] == grids["before"][0, t]).all() for t in range(tokens))
    fig = draw_ulysses(grids, cp)
    check_figure(fig)
    plt.close(fig)


def test_a_value_held_twice_or_never_is_refused():
    twice = [{"before": [0, 1], "after": [0, 1]}, {"before": [1], "after": []}]
    with pytest.raises(ValueError, match="held by ranks 0 and 1"):
        owner_grids(twice, 1, 2)
    never = [{"before": [0], "after": [0]}]
    with pytest.raises(ValueError, match="held by no rank"):
        owner_grids(never, 1, 2)
