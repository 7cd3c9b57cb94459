"""The Megatron split picture draws the shard shapes the tensor-parallel layers hold."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch.nn as nn  # noqa: E402

from lecture_lib.figures.check import check_figure  # noqa: E402
from lecture_lib.figures.pictures.tp_splits import draw_tp_splits, split_blocks  # noqa: E402
from lecture_lib.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from lecture_lib.tensor_parallel.layers import weight_shard_shape  # noqa: E402


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_shard_shapes_for_tp4_are_written_on_the_blocks():
    fig, blocks = draw_tp_splits(batch=2, seq=16, hidden=64, heads=8, tp=4)
    texts = _texts(fig)
    shapes = {name.split("\n")[0]: shape for kind, name, shape in
              blocks["attention"] + blocks["mlp"] if kind == "weight"}
    assert shapes == {"W_QKV": "[64, 48]", "W_O": "[16, 64]", "W1": "[64, 64]",
                      "W2": "[64, 64]"}                 # [h, 3h/tp], [h/tp, h], [h, 4h/tp], ...
    for shape in (*shapes.values(), "[2, 16, 64]", "[2, 16, 16]", "[2, 16, 48]"):
        assert shape in texts, shape
    assert "attention\n2 of 8 heads" in texts
    check_figure(fig)
    plt.close(fig)


def test_f_before_and_g_after_each_split_block():
    blocks = split_blocks(1, 8, 32, 4, 2)
    for row in blocks.values():
        kinds = [k for k, *_ in row]
        comm = [name for k, name, _ in row if k == "comm"]
        assert kinds[0] == kinds[-1] == "tensor" and kinds[1] == kinds[-2] == "comm", kinds
        assert comm[0].startswith("f\nfwd: identity\nbwd: all-reduce"), comm
        assert comm[1].startswith("g\nfwd: all-reduce\nbwd: identity"), comm
        assert [k for k in kinds if k == "weight"] == ["weight", "weight"]   # column, then row


def test_the_rule_is_the_layers_own():
    full = nn.Linear(8, 12)
    col = ColumnParallelLinear.from_linear(full)        # no process group: one rank holds all
    row = RowParallelLinear.from_linear(full)
    assert tuple(col.weight.T.shape) == weight_shard_shape(8, 12, 1, "column")
    assert tuple(row.weight.T.shape) == weight_shard_shape(8, 12, 1, "row")
    assert weight_shard_shape(8, 12, 4, "column", rank=3) == (8, 3)
    assert weight_shard_shape(8, 12, 4, "row", rank=3) == (2, 12)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="heads=6 is not divisible"):
        split_blocks(1, 8, 48, 6, 4)
    with pytest.raises(ValueError, match="tp must be"):
        split_blocks(1, 8, 32, 4, 0)
    with pytest.raises(ValueError, match="split must be"):
        weight_shard_shape(8, 8, 2, "diagonal")
