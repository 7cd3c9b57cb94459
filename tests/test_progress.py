"""lecture_lib.progress: plain lines outside a kernel, a widget bar inside one, overrides."""
import pytest

from lecture_lib import debugging
from lecture_lib import progress as pg


def test_lines_outside_a_kernel(capsys, monkeypatch):
    monkeypatch.setattr(pg, "LINE_INTERVAL", 0.0)             # every step prints
    assert pg.mode() == "lines"                                # pytest is not interactive
    assert list(pg.progress(range(3), "sweep")) == [0, 1, 2]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sweep: 0/3") and lines[-1].startswith("sweep: 3/3")
    assert len(lines) == 4 and "left" in lines[1] and "left" not in lines[-1]


def test_lines_are_throttled_but_the_last_always_shows(capsys):
    assert sum(pg.progress(range(1000), "many")) == sum(range(1000))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) < 20 and lines[-1].startswith("many: 1000/1000")


def test_an_iterable_without_length_reports_its_count(capsys):
    assert list(pg.progress((i for i in range(4)), "gen", show="lines")) == [0, 1, 2, 3]
    assert capsys.readouterr().out.splitlines()[-1].startswith("gen: 4 after")


def test_off_and_environment_override(capsys, monkeypatch):
    monkeypatch.setenv(pg.ENV, "off")
    assert pg.mode() == "off"
    assert list(pg.progress([1, 2], "quiet")) == [1, 2]
    assert capsys.readouterr().out == ""
    monkeypatch.setenv(pg.ENV, "loud")
    with pytest.raises(ValueError, match="LECTURE_LIB_PROGRESS"):
        pg.mode()
    with pytest.raises(ValueError, match="show must be"):
        list(pg.progress([1], show="fancy"))


def test_bar_mode_draws_and_completes_a_widget(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objs: shown.extend(objs))
    assert list(pg.progress(range(5), "bar", show="bar")) == list(range(5))
    (box,) = shown
    bar, label = box.children
    assert (bar.value, bar.max, bar.bar_style) == (5, 5, "success")
    assert label.value.startswith("bar: 5/5")


def test_describe_estimates_time_left():
    assert pg.describe("x", 1, 4, 10.0) == "x: 1/4 after 10 s, about 30 s left"
    assert pg.describe("x", 2, None, 300.0) == "x: 2 after 5.0 min"


def test_a_wired_experiment_reports_its_rounds_and_keeps_its_results(capsys, monkeypatch):
    monkeypatch.setenv(pg.ENV, "lines")
    monkeypatch.setattr(pg, "LINE_INTERVAL", 0.0)             # every step prints
    configs = [dict(steps=1), dict(steps=2), dict(steps=3)]
    runs = debugging.sweep(configs, world_size=2, timeout=120)  # 2 rounds: 2 runs, then 1
    assert [len(r["losses"]) for r in runs] == [1, 2, 3]        # in the order of configs
    assert runs[0]["losses"] == pytest.approx(debugging.train_gpt(steps=1)["losses"], rel=1e-6)
    lines = [s for s in capsys.readouterr().out.splitlines() if s.startswith("sweep:")]
    assert lines[0].startswith("sweep: 3 runs, 2 at a time: 0/2")
    assert lines[-1].startswith("sweep: 3 runs, 2 at a time: 2/2") and len(lines) == 3
