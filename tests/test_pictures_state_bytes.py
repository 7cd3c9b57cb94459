"""The bytes-per-parameter picture draws the memory model's own precisions: each bar splits
Adam's model state into weights, gradients, fp32 master weights and the two moments, and sums
to what ``costmodel.model_state_bytes`` counts."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lecture_lib.costmodel import model_state_bytes  # noqa: E402
from lecture_lib.costmodel.memory import PRECISIONS  # noqa: E402
from lecture_lib.figures.check import check_figure  # noqa: E402
from lecture_lib.figures.pictures.state_bytes import ADAM_MOMENT_BYTES, draw_state_bytes, segments  # noqa: E402


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_segments_sum_to_the_memory_models_bytes(precision):
    p, g, k = PRECISIONS[precision]
    parts = segments(precision)
    assert sum(b for _, b in parts) == model_state_bytes(1, param_bytes=p, grad_bytes=g,
                                                         optimizer_bytes_per_param=k)
    assert parts[-1] == ("Adam's two moments, fp32", ADAM_MOMENT_BYTES)


def test_mixed_precision_splits_its_optimizer_state_into_master_weights_and_moments():
    assert segments("mixed (bf16/fp16 + fp32 master)") == [
        ("weights, 16-bit", 2), ("gradients, 16-bit", 2), ("master weights, fp32", 4),
        ("Adam's two moments, fp32", 8)]
    assert segments("fp32") == [("weights, fp32", 4), ("gradients, fp32", 4),
                                ("Adam's two moments, fp32", 8)]


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of"):
        segments("fp8")


def test_picture_draws_one_bar_per_precision_and_reads():
    fig, drawn = draw_state_bytes()
    check_figure(fig)
    assert list(drawn) == list(PRECISIONS)
    assert all(total == 16 for total in drawn.values())
    plt.close(fig)
