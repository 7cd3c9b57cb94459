"""lecture_lib.tolerance: tolerances derived from the format and the number of roundings."""
import math

import pytest
import torch

from lecture_lib import tolerance as T


def test_unit_roundoff_is_half_the_machine_epsilon():
    assert T.unit_roundoff(torch.bfloat16) == 2.0 ** -8
    assert T.unit_roundoff(torch.float16) == 2.0 ** -11
    assert T.unit_roundoff(torch.float32) == 2.0 ** -24


def test_rtol_grows_as_the_square_root_of_depth_and_with_coarser_formats():
    assert T.rtol(torch.bfloat16, 100) > T.rtol(torch.float16, 100) > T.rtol(torch.float32, 100)
    ratio = T.rtol(torch.bfloat16, 400) / T.rtol(torch.bfloat16, 100)
    assert 2 < ratio < 2.2                       # sqrt(4) times the slowly growing lam
    lam = T.spread(100)
    assert 2 * 100 * math.exp(-lam ** 2 / 2) == pytest.approx(T.FAILURE)


def test_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        T.unit_roundoff(torch.int32)
    with pytest.raises(TypeError, match="floating-point"):
        T.rtol("bf16", 4)
    for depth in (0, -1, 2.5):
        with pytest.raises(ValueError, match="depth"):
            T.rtol(torch.bfloat16, depth)
    with pytest.raises(ValueError, match="n_layers"):
        T.gpt_depth(0)
    with pytest.raises(ValueError, match="at least one element"):
        T.scale_floor({"a": torch.zeros(0)})


@pytest.mark.sixteen_bit
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_chain_of_roundings_stays_within_half_the_two_run_bound(dtype):
    """Sums accumulated term by term in 16 bits, against float64: the bound of one run."""
    gen = torch.Generator().manual_seed(0)
    for depth in (8, 64, 512):
        worst = 0.0
        for _ in range(50):
            terms = torch.rand(depth, generator=gen, dtype=torch.float64) + 0.5
            acc = torch.zeros((), dtype=dtype)
            for t in terms.to(dtype):
                acc = acc + t                    # rounds once per term
            exact = terms.to(dtype).double().sum()
            worst = max(worst, abs(acc.double().item() - exact.item()) / exact.item())
        assert worst <= T.rtol(dtype, depth) / 2, (dtype, depth, worst)
        assert worst > T.unit_roundoff(dtype) / 4, (dtype, depth, worst)   # it did round


def test_gpt_depth_counts_the_chain_and_the_ranks():
    assert T.gpt_depth(2, 4) - T.gpt_depth(2, 1) == 3
    assert T.gpt_depth(3) - T.gpt_depth(2) == T.GPT_BLOCK_OPS


def test_scale_floor_lifts_only_tensors_that_hold_noise():
    scales = T.scale_floor({"w": torch.ones(100), "noise": torch.full((4,), 1e-9)})
    assert scales["w"] == pytest.approx(10.0, rel=1e-6)
    rms = math.sqrt(100 / 104)
    assert scales["noise"] == pytest.approx(rms * 2, rel=1e-6)
