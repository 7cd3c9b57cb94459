"""The calibration table (lecture_lib.calibration.published): the emulation against published
GPU measurements (lecture_lib.emulate.published). Fitted anchors must be reproduced, checks the
constants never saw must agree within the tolerances appendix A2 asserts."""

import pytest

from lecture_lib.calibration import published
from lecture_lib.emulate import published as P
from lecture_lib.study.the_emulated_cluster import faster_by

FITTED_TOLERANCE, CHECK_TOLERANCE, MEDIAN_TOLERANCE = 0.03, 0.15, 0.10


@pytest.fixture(scope="module")
def rows():
    """The table without the llm.c step (pure and fast: formulas and meta tensors)."""
    return published.table([a for a in P.ANCHORS if a is not P.LLMC_STEP])


def test_one_row_per_anchor_with_its_source(rows):
    assert [r["anchor"] for r in rows] == [a.key for a in P.ANCHORS if a is not P.LLMC_STEP]
    for r in rows:
        assert r["published"] > 0 and r["emulated"] > 0
        assert r["error"] == pytest.approx(r["emulated"] / r["published"] - 1)
        assert r["fitted"] == (r["anchor"] in P.FITTED)
        assert r["source"] in P.__doc__                   # every source is cited


def test_fitted_anchors_are_reproduced(rows):
    fitted = [r for r in rows if r["fitted"]]
    assert len(fitted) == len(P.FITTED)                  # every fitted anchor is in the table
    bad = {r["anchor"]: r["error"] for r in fitted if abs(r["error"]) > FITTED_TOLERANCE}
    assert not bad, bad


def test_checks_agree(rows):
    checks = [r for r in rows if not r["fitted"]]
    assert checks
    bad = {r["anchor"]: r["error"] for r in checks if abs(r["error"]) > CHECK_TOLERANCE}
    assert not bad, bad
    summary = published.summary(rows)
    assert summary["checks"] == len(checks)
    assert summary["median"] <= MEDIAN_TOLERANCE
    assert summary["worst"] == max(abs(r["error"]) for r in checks)


# The end-to-end row (llm.c's GPT-2 step on 8 emulated H100s, about a minute of 8 dry-run ranks)
# is asserted with every other check in appendix A2's calibration table, which CI runs.


def test_every_anchor_names_a_source_with_its_citation():
    """A2 prints each check's source beside it: every anchor's key is cited in SOURCES."""
    assert {a.source for a in P.ANCHORS} <= set(P.SOURCES)
    assert all(len(text) > 20 for text in P.SOURCES.values())


def test_the_opening_figure_reads_faster_to_the_right_for_rates_and_times():
    rate = {"unit": "FLOP/s", "published": 100.0, "emulated": 110.0}
    assert faster_by(rate) == pytest.approx(0.1)
    assert faster_by({"unit": "s", "published": 139.0, "emulated": 144.2}) < 0      # slower step
    assert faster_by({"unit": "s", "published": 100.0, "emulated": 90.0}) == pytest.approx(0.1)
    # a row's size is its error, whatever the unit: one number, one sign in the table and the figure
    for row in (rate, {"unit": "s", "published": 139.0, "emulated": 144.2}):
        error = row["emulated"] / row["published"] - 1
        assert abs(faster_by(row)) == pytest.approx(abs(error))
