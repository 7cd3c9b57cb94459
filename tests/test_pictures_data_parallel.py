"""The data-parallel picture draws the library's own layout: contiguous shards of the batch
(models.shard), buckets in backward's order (ddp.make_buckets), and each bucket's all-reduce
started once its gradients are ready and the bucket before it is done."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib.figures.check import check_figure  # noqa: E402
from lecture_lib.figures.pictures.data_parallel import draw, layout  # noqa: E402


def spans(data, kind, rank=0):
    return [s for s in data["steps"][rank] if s[0] == kind]


def test_shards_are_contiguous_slices_that_tile_the_batch():
    data = layout(p=4, batch=8)
    assert data["shards"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert sorted(i for s in layout(p=3, batch=9)["shards"] for i in s) == list(range(9))


def test_buckets_hold_the_layers_in_backward_order():
    assert layout(layers=6, layers_per_bucket=2)["buckets"] == [[6, 5], [4, 3], [2, 1]]
    assert layout(layers=5, layers_per_bucket=2)["buckets"] == [[5, 4], [3, 2], [1]]
    assert layout(layers=4, layers_per_bucket=9)["buckets"] == [[4, 3, 2, 1]]


def test_each_all_reduce_starts_when_its_bucket_is_ready_and_in_order():
    data = layout(layers=6, layers_per_bucket=2)
    ready = {int(text[1:]): end for _, _, end, text in spans(data, "backward")}
    previous_end = 0.0
    for bucket, (_, start, end, _) in zip(data["buckets"], spans(data, "comm")):
        assert start == max(max(ready[layer] for layer in bucket), previous_end)
        previous_end = end
    (_, step_start, _, _), = spans(data, "optimizer")
    assert step_start == max(data["backward_end"], previous_end)
    assert data["exposed"] == pytest.approx(previous_end - data["backward_end"])
    # all but the last bucket's all-reduce end before backward does: only the last is exposed
    assert all(end <= data["backward_end"] for _, _, end, _ in spans(data, "comm")[:-1])


def test_every_rank_runs_the_same_step():
    data = layout(p=4)
    assert all(data["steps"][r] == data["steps"][0] for r in range(4))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        layout(p=3, batch=8)
    with pytest.raises(ValueError):
        layout(layers=0)


def test_the_figure_draws_the_layout_and_is_legible():
    fig, data = draw()
    assert len(data["drawn"]) == 4 * len(data["steps"][0])
    written = {b["text"] for b in data["drawn"] if b["text"]}
    assert {"L6", "L1", "bucket 1", "bucket 3", "step"} <= written
    check_figure(fig)
    plt.close(fig)
