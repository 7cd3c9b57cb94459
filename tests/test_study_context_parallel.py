"""lecture_lib.study.context_parallel: where grouped-query attention's K/V heads go under tensor
parallelism (notebook 05, section 5), and the hop-hiding threshold's bytes per value (Q4)."""
import pytest

from lecture_lib.costmodel import NVLINK_H100
from lecture_lib.costmodel.tensor_parallel import H100_BF16_FLOPS
from lecture_lib.study import context_parallel as study


@pytest.mark.parametrize("tp, expected", [(1, (8, 1)), (2, (4, 1)), (4, (2, 1)), (8, (1, 1)),
                                          (16, (1, 2)), (32, (1, 4)), (64, (1, 8))])
def test_llama3_70b_kv_heads_split_then_replicate(tp, expected):
    """64 query heads, 8 K/V heads: up to tp = 8 each rank holds 8/tp; past it one, on tp/8."""
    assert study.kv_heads_per_rank(64, 8, tp) == expected


def test_without_gqa_every_rank_holds_its_own_heads():
    assert study.kv_heads_per_rank(64, 64, 8) == (8, 1)


@pytest.mark.parametrize("heads, kv_heads, tp, why", [
    (12, 4, 6, "not a multiple"),          # 6 > 4 and 4 does not divide 6
    (24, 8, 12, "not a multiple"),         # 12 > 8, not a multiple of 8
    (12, 6, 4, "does not divide the 6"),   # 4 <= 6 and does not divide 6
    (64, 8, 3, "query heads do not split"),
    (12, 5, 2, "kv_heads dividing heads"),
])
def test_a_placement_that_does_not_exist_is_refused(heads, kv_heads, tp, why):
    with pytest.raises(ValueError, match=why):
        study.kv_heads_per_rank(heads, kv_heads, tp)


def test_q4_threshold_is_bf16():
    """Q4 asks in bf16 (e = 2 bytes per value); notebook 05's section 7 uses e = 4 (fp32)."""
    per_rank, _, gqa, chunks, share, at_share = study.hop_hiding_length()
    local = 2 * H100_BF16_FLOPS / NVLINK_H100.beta
    assert per_rank == f"{local:.0f} tokens"
    assert gqa == f"{local / 4:.0f} tokens"            # Llama 3 8B: K/V a quarter of h wide (GQA)
    assert chunks == "512-token chunks" and 0 < float(share.rstrip("%")) < 100
    # the share is printed rounded to 0.1%: the threshold it gives is within a token of the text
    assert abs(int(at_share.split()[0]) - local / 4 * float(share.rstrip("%")) / 100) <= 1
