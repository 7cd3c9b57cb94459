"""Mixed precision and activation checkpointing (lecture_lib.precision), on one process.

Tolerances: bf16 loss within lecture_lib.tolerance.rtol(bf16, gpt_depth(2)) (relative) of fp32
at every one of 20 steps (the rounding bound of a 2-layer GPT step in bf16; measured: under 2%);
fp16 with dynamic loss scaling within 5% at the last step (measured: 2%; its
first step is skipped on purpose: the initial scale 2^16 overflows, as in torch's
GradScaler, so it trails fp32 by a step);
bytes per parameter within 1% of 2 + 2 + 12; checkpointed gradients equal to the
plain ones (rtol 1e-6).
"""
import math

import pytest
import torch

from lecture_lib import precision as P
from lecture_lib import tolerance
from lecture_lib.costmodel import model_state_breakdown
from lecture_lib.models import GPT, GPTConfig, MarkovText

CFG = GPTConfig(n_layers=2)
DATA = MarkovText()
STEPS = 20


def batches(step):
    return DATA.batch(step, 16)


@pytest.fixture(scope="module")
def runs():
    return {d: P.train_precision(lambda: GPT(CFG), batches, STEPS, d, lr=3e-3)
            for d in ("fp32", "bf16", "fp16")}


def test_bf16_bytes_per_parameter_match_the_zero_paper(runs):
    n = sum(p.numel() for p in GPT(CFG).parameters())
    formula = model_state_breakdown(n)                  # 2 + 2 + 12 bytes per parameter
    for dtype in ("bf16", "fp16"):
        held = runs[dtype]["held"]
        for kind in ("params", "grads", "optimizer"):
            assert held[kind] == pytest.approx(formula[kind], rel=0.01), (dtype, kind)
        assert runs[dtype]["bytes_per_param"] == pytest.approx(16, rel=0.01)
    assert runs["fp32"]["bytes_per_param"] == pytest.approx(20, rel=0.01)


@pytest.mark.sixteen_bit
def test_bf16_loss_curve_follows_fp32(runs):
    rtol = tolerance.rtol(torch.bfloat16, tolerance.gpt_depth(CFG.n_layers))
    for step, (a, b) in enumerate(zip(runs["bf16"]["losses"], runs["fp32"]["losses"])):
        assert abs(a - b) / b < rtol, f"step {step}: bf16 {a} vs fp32 {b} (rtol {rtol:.3g})"
    assert runs["bf16"]["losses"][-1] < 0.8 * runs["bf16"]["losses"][0]   # it learns


@pytest.mark.sixteen_bit
def test_fp16_with_dynamic_loss_scaling(runs):
    fp16, fp32 = runs["fp16"], runs["fp32"]
    assert fp16["skipped"] >= 1 and fp16["scale"] < 2.0 ** 16       # overflow seen, scale halved
    # the skipped step (and its batch) is never taken, so fp16 trails fp32 a little
    assert abs(fp16["losses"][-1] - fp32["losses"][-1]) / fp32["losses"][-1] < 0.05


def test_a_skipped_step_leaves_the_weights_alone():
    trainer = P.MixedPrecisionTrainer(GPT(CFG), "fp16", loss_scale=2.0 ** 40)
    before = [m.clone() for m in trainer.master]
    trainer.step(*batches(0))
    assert trainer.skipped == 1 and trainer.scale == 2.0 ** 39
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.master))


def test_checkpointing_keeps_less_and_computes_the_same():
    x, y = batches(0)
    grads = {}
    for on in (False, True):
        model = GPT(GPTConfig(n_layers=4))
        P.checkpoint_blocks(model, on)
        model(x, y).backward()
        grads[on] = [p.grad.clone() for p in model.parameters()]
    for a, b in zip(grads[False], grads[True]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    plain, ckpt = ([P.activation_profile(GPT(GPTConfig(n_layers=n)), x, y, on)
                    ["activation_bytes"] for n in (2, 4)] for on in (False, True))
    per_layer_plain, per_layer_ckpt = (plain[1] - plain[0]) / 2, (ckpt[1] - ckpt[0]) / 2
    b, t, h = x.shape[0], x.shape[1], GPTConfig().d_model
    assert per_layer_ckpt == 4 * b * t * h             # only the block's fp32 input is kept
    assert per_layer_plain > 10 * per_layer_ckpt


def test_bad_input():
    with pytest.raises(ValueError, match="dtype must be one of"):
        P.MixedPrecisionTrainer(GPT(CFG), "fp8")
    with pytest.raises(ValueError, match="loss_scale"):
        P.MixedPrecisionTrainer(GPT(CFG), "fp16", loss_scale=-1)
    with pytest.raises(TypeError, match="no .blocks"):
        P.checkpoint_blocks(torch.nn.Linear(2, 2))


def test_checkpointing_counts_one_more_forward():
    """FLOPs counted, not timed: forward 1 + backward 2 + recomputed forward 1 of the blocks."""
    x, y = MarkovText().batch(0, 4)
    plain, ckpt = (P.activation_profile(GPT(GPTConfig(n_layers=2)), x, y, on)
                   ["step_flops"] for on in (False, True))
    assert 1.1 < ckpt / plain <= 4 / 3, (plain, ckpt)    # embeddings and head are not recomputed


class _Tiny(torch.nn.Module):
    """loss = w * x * x: in fp16 the gradient x^2 = 1e-8 lies below the smallest subnormal."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x, y):
        return (self.w * x.to(self.w.dtype) * x.to(self.w.dtype)).sum()


def test_fp16_underflow_counts_gradients_that_round_to_zero_or_lose_bits():
    x = torch.full((1,), 1e-4)
    counted = P.fp16_underflow(_Tiny, x, None, scales=(1.0, 1024.0, 2.0 ** 15, 2.0 ** 40))
    assert counted[1.0]["zero"] == 1 and counted[1.0]["nonzero"] == 1    # 1e-8 underflows
    assert counted[1024.0]["zero"] == 0              # kept, but 1.0e-5 (scaled) lies
    assert counted[1024.0]["below fp16 normal"] == 1         # below 2^-14: fewer bits
    assert counted[2.0 ** 15]["below fp16 normal"] == 0      # 3.3e-4: in the normal range
    assert counted[2.0 ** 15]["error p90"] < 2e-3            # only rounding: 2^-11 per factor
    assert counted[2.0 ** 40]["not finite"] == 1             # too large: inf
    assert math.isnan(counted[2.0 ** 40]["error p90"])


def test_fp16_underflow_on_the_small_gpt_is_lifted_by_a_scale_and_overflows_past_it():
    x, y = DATA.batch(0, 16)
    counted = P.fp16_underflow(lambda: GPT(CFG), x, y, scales=(1.0, 256.0, 2.0 ** 16))
    one, lifted, huge = (counted[s] for s in (1.0, 256.0, 2.0 ** 16))
    assert one["nonzero"] > 0.99 * sum(p.numel() for p in GPT(CFG).parameters())
    assert one["zero"] > 0 and one["not finite"] == 0
    assert lifted["zero"] < one["zero"] and lifted["not finite"] == 0
    # unscaled, a tenth or more of the values are fp16 subnormals; scaled, under 1%
    assert one["below fp16 normal"] > 0.1 * one["nonzero"] > 10 * lifted["below fp16 normal"]
    assert lifted["error p90"] < one["error p90"] / 2         # scaled gradients: closer to fp32's
    assert huge["not finite"] > 0          # the first step of training overflows too


def test_fp16_underflow_under_autocast_keeps_the_loss_in_fp32_so_the_scalers_start_fits():
    x, y = DATA.batch(0, 16)
    scales = (1.0, 256.0, 2.0 ** 16, 2.0 ** 24)
    counted = P.fp16_underflow(lambda: GPT(CFG), x, y, scales=scales, autocast=True)
    one, lifted, start, huge = (counted[s] for s in scales)
    assert one["nonzero"] > 0.99 * sum(p.numel() for p in GPT(CFG).parameters())
    # the activation gradients are fp16 under autocast: unscaled, values vanish or lose bits
    assert one["zero"] > 0 and one["below fp16 normal"] > 0.1 * one["nonzero"]
    assert lifted["below fp16 normal"] < 0.01 * lifted["nonzero"]
    assert lifted["error p90"] < one["error p90"] / 2
    # the loss and its first gradient are fp32: the scaler's starting scale does not overflow
    assert start["not finite"] == 0 and start["error p90"] < one["error p90"] / 2
    assert huge["not finite"] > 0          # a large enough scale still overflows the fp16 ones


def test_fp16_underflow_under_autocast_loses_nothing_in_an_op_autocast_keeps_in_fp32():
    # _Tiny multiplies elementwise, which autocast leaves in fp32: 1e-8 lies below fp16's
    # normal range but is computed in fp32 and kept exactly
    counted = P.fp16_underflow(_Tiny, torch.full((1,), 1e-4), None, scales=(1.0,), autocast=True)
    assert counted[1.0]["below fp16 normal"] == 1 and counted[1.0]["zero"] == 0
    assert counted[1.0]["error p90"] < 1e-6


def test_fp16_underflow_refuses_a_scale_that_is_not_positive():
    with pytest.raises(ValueError, match="scales must be positive"):
        P.fp16_underflow(lambda: GPT(CFG), *DATA.batch(0, 2), scales=(0.0,))
