"""capstone.launches: notebook 10's emulated step and the kernels in torch.compile's graphs."""
import torch

from lecture_lib import emulate
from lecture_lib.capstone import launches
from lecture_lib.models import GPT, GPTConfig

CFG = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=1)


def test_the_loaders_layout_costs_one_copy_kernel():
    x, y = launches.loader_layout_batch(CFG, 4)
    assert not y.is_contiguous() and torch.equal(x[:, 1:], y[:, :-1])
    sliced = launches.emulated_step(CFG, x, y, "h100-node")
    contiguous = launches.emulated_step(CFG, x.contiguous(), y.contiguous(), "h100-node")
    assert round(sliced["kernels"] - contiguous["kernels"]) == 1       # the targets' copy
    assert sliced["step"] > contiguous["step"]
    assert launches.emulated_step(CFG, x, y, "h100-node") == sliced    # emulated: deterministic


def test_count_kernels_matches_the_emulations_launches():
    x, y = launches.loader_layout_batch(CFG, 4)
    counts = launches.count_kernels(launches.capture(GPT(CFG, 0), x, y))["total"]
    step = launches.emulated_step(CFG, x, y, "h100-node")
    eager = step["host forward + backward"] / emulate.preset("h100-node").device.launch_seconds
    assert abs(counts["ops"] - eager) <= 2
    # 6 linear layers + the head forward (addmm, mm), two matmuls each backward; attention each way
    assert counts["library"] == (6 + 1) + 2 * (6 + 1) + 2
    assert counts["library"] < counts["compiled"] < counts["ops"]
    assert counts["compiled"] == counts["library"] + counts["groups"]


def test_real_ratios_pair_the_calls():
    calls = []
    ratios = launches.real_ratios(lambda: calls.append(1), lambda: calls.append(2), repeats=3)
    assert calls == [1, 2] * 4 and len(ratios) == 3 and all(r > 0 for r in ratios)
