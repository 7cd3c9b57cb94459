"""The rank-grid picture draws the grid lecture_lib.mesh computes: who shares which group,
which node holds which rank; no process is started."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib.figures.check import problems  # noqa: E402
from lecture_lib.figures.pictures.rank_grid import draw_rank_grid, rank_grid_layout  # noqa: E402
from lecture_lib.mesh import grid_groups  # noqa: E402


def test_tp_groups_are_consecutive_ranks_inside_one_node():
    layout = rank_grid_layout({"dp": 2, "pp": 2, "tp": 4}, gpus_per_node=4)
    assert layout["groups"]["tp"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert layout["groups"]["pp"][0] == [0, 4] and layout["groups"]["dp"][0] == [0, 8]
    assert not any(layout["crosses_nodes"]["tp"])
    assert all(layout["crosses_nodes"]["pp"]) and all(layout["crosses_nodes"]["dp"])
    assert layout["node"][5] == 1 and layout["coords"][5] == {"dp": 0, "pp": 1, "tp": 1}


def test_with_context_parallelism_tp_and_cp_stay_in_the_node():
    layout = rank_grid_layout({"dp": 2, "pp": 2, "cp": 2, "tp": 2}, gpus_per_node=4)
    assert layout["groups"]["cp"][0] == [0, 2]
    assert not any(layout["crosses_nodes"]["tp"]) and not any(layout["crosses_nodes"]["cp"])
    assert all(layout["crosses_nodes"]["pp"])


def test_tp_slowest_puts_its_groups_across_nodes():
    layout = rank_grid_layout({"tp": 4, "dp": 2, "pp": 2}, gpus_per_node=4)
    assert layout["groups"]["tp"][0] == [0, 4, 8, 12] and all(layout["crosses_nodes"]["tp"])
    assert not any(layout["crosses_nodes"]["pp"])


def test_the_figure_writes_each_rank_and_its_coordinates_and_is_legible():
    dims = {"dp": 2, "pp": 2, "tp": 2}
    fig, layout = draw_rank_grid(dims, gpus_per_node=2)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "rank 5\ndp1 pp0 tp1" in texts and "node 3" in texts
    assert layout["groups"] == {d: grid_groups(dims, d) for d in dims}
    lines = {line.get_label() for line in fig.axes[0].get_lines()}
    assert {"pp group", "dp group:\nsame letter"} <= lines
    assert problems(fig) == []
    plt.close(fig)


@pytest.mark.parametrize("dims, g", [({"dp": 3}, 2), ({"dp": 2, "xx": 2}, 2), ({"dp": 2}, 0)])
def test_bad_input(dims, g):
    with pytest.raises(ValueError):
        rank_grid_layout(dims, g)
