"""The grader's per-rank mismatch line: shape, first differing positions, largest error, and
values summarised whole (lecture_lib.grading.harness.difference); no process is started."""
import pytest
import torch

from lecture_lib.grading.harness import _short, assert_close_per_rank, difference


def test_a_mismatch_names_shape_first_positions_and_largest_error():
    want = torch.tensor([10.0, 14, 18, 12, 16, 10, 14, 18, 12, 16, 10, 14])
    got = want.clone()
    got[6:] = torch.tensor([2.0, 4, 1, 3, 0, 2])
    line = difference(got, want)
    assert line.startswith("shape (12,): 6 of 12 elements differ")
    assert "first at (6,) expected 14, got 2; at (7,) expected 18, got 4" in line
    assert "largest error 14 at (7,)" in line
    assert "\n" not in line


def test_values_are_summarised_whole_never_cut_inside_a_number():
    text = _short(torch.arange(1000.0) + 0.5)
    assert text == ("tensor([5.0000e-01, 1.5000e+00, 2.5000e+00, ..., 9.9750e+02, 9.9850e+02, "
                    "9.9950e+02])")
    cut = _short(list(range(100, 400)))
    body, note = cut.split(", ... (")
    assert all(item.strip().isdigit() for item in body.strip("[").split(","))   # whole numbers
    assert note.endswith("more characters)")


def test_every_rank_that_differs_has_its_line():
    want = torch.ones(2, 3)
    with pytest.raises(AssertionError) as info:
        assert_close_per_rank([want, torch.zeros(2, 3), torch.ones(3, 2)], want, "the sum")
    lines = str(info.value).splitlines()
    assert lines[0].startswith("the sum is wrong on 2 of 3 ranks: rank 1: shape (2, 3): 6 of 6")
    assert lines[1].startswith("rank 2: shape (3, 2) (expected (2, 3)): expected tensor(")
