"""The memory calculator draws what lecture_lib.costmodel.memory_per_device computes."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from lecture_lib.costmodel import GB, PRESETS, memory_per_device  # noqa: E402
from lecture_lib.figures.widgets.memory import calculator_figure, memory_calculator  # noqa: E402


def test_bars_are_the_formula():
    fig, bars = calculator_figure("Llama-style 70B", dp=8, tp=4, pp=2, zero_stage=2,
                                  microbatch_size=2, seq_len=4096)
    want = memory_per_device(PRESETS["Llama-style 70B"], 8, 4, 2, 3, 2, 4096, "selective", True)
    assert bars["ZeRO-3"] == want
    ax = fig.axes[0]
    tops = sorted({round(p.get_y() + p.get_height(), 6) for p in ax.patches})
    for s in range(4):
        assert round(bars[f"ZeRO-{s}"]["total"] / GB, 6) in tops
    assert any(line.get_ydata()[0] == 80 for line in ax.lines)


def test_widget_updates_and_reports_bad_configs():
    panel = memory_calculator()
    panel.controls["preset"].value = "course small GPT"
    assert "4 layers do not split into pp=8" in panel.state["error"]
    panel.controls["pp"].value = 1
    assert "4 heads do not split over tp=8" in panel.state["error"]
    panel.controls["tp"].value = 1
    assert panel.state["error"] is None
    want = memory_per_device(PRESETS["course small GPT"], 64, 1, 1, 1, 1, 2048, "selective", True)
    assert panel.state["bars"]["ZeRO-1"] == want


def test_bad_preset():
    with pytest.raises(ValueError, match="preset must be one of"):
        calculator_figure("GPT-5")
