"""Context parallelism equals one process: ring and Ulysses attention (outputs and gradients),
the online-softmax merge, both layouts, grouped-query attention, both block kernels, the GPT
trained with cp; the dry run reads the real run's clock, and at real size the lessons hold;
bad input fails early, and the slices' check runs once per shape."""
import re

import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import emulate
from lecture_lib.comm import record_comm
from lecture_lib.context_parallel import (
    RingAttention,
    attention_reference,
    block_attention,
    block_pairs,
    check_layout,
    check_ulysses,
    flash_block_attention,
    make_attention,
    merge,
    positions,
    rank_chunks,
    ring_attention,
    ring_schedule,
    shard_sequence,
    unshard_sequence,
)
from lecture_lib.context_parallel.emulated import layers_pass, time_at_scale
from lecture_lib.context_parallel.experiments import (
    CASES,
    attention_on_rank,
    compare_attention,
    compare_with_torch,
    measure_activation_memory,
    measure_attention_flops,
    measure_ring_overlap,
    train_context_parallel,
)
from lecture_lib.costmodel.context_parallel import (
    gpt_block_activation_bytes,
    ring_attention_flops,
    ring_bytes_per_layer,
    ulysses_bytes_per_layer,
)
from lecture_lib.figures.pictures.ring_steps import cell_labels, draw_ring_steps
from lecture_lib.models import (
    GPT,
    GPTConfig,
    MarkovText,
    assert_same_training,
    real_size,
    train_reference,
)

SHAPE = (2, 4, 32, 8)                     # batch, heads, tokens, head_dim


def test_merge_of_two_halves_is_one_softmax():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    a = block_attention(q, k[..., :2, :], v[..., :2, :])
    b = block_attention(q, k[..., 2:, :], v[..., 2:, :])
    o, lse = merge(*a, *b)
    torch.testing.assert_close(o, attention_reference(q, k, v, causal=False))
    torch.testing.assert_close(lse, torch.logsumexp(q @ k.transpose(-2, -1) / 2.0, -1))
    o2, _ = merge(*b, *a)                                           # order does not matter
    torch.testing.assert_close(o2, o)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_one_process_ring_is_exact_with_gradients(layout):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(*SHAPE, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    for causal in (True, False):
        small = tuple(x[:1, :1, :8].detach().requires_grad_(True) for x in (q, k, v))
        assert torch.autograd.gradcheck(
            lambda *t, c=causal: ring_attention(*t, "local", layout, c), small)
        torch.testing.assert_close(ring_attention(q, k, v, "local", layout, causal),
                                   attention_reference(q, k, v, causal))


@pytest.mark.parametrize("kernel", ["blockwise", "flash"])
def test_one_process_ring_with_grouped_query_attention_is_exact(kernel):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2))                       # 2 K/V heads, each serving 2 query heads
    for layout in ("contiguous", "zigzag"):
        for causal in (True, False):
            assert torch.autograd.gradcheck(
                lambda *t, c=causal, lay=layout: ring_attention(*t, "local", lay, c, kernel),
                (q, k, v))
            torch.testing.assert_close(ring_attention(q, k, v, "local", layout, causal, kernel),
                                       attention_reference(q, k, v, causal))


def test_layouts_shard_and_unshard():
    x = torch.arange(16).view(1, 16)
    assert positions(1, 4, 16, "zigzag").tolist() == [2, 3, 12, 13]       # chunks 1 and 6
    assert rank_chunks(0, 4, "zigzag") == [0, 7] and rank_chunks(2, 4, "contiguous") == [2]
    for layout in ("contiguous", "zigzag"):
        parts = [shard_sequence(x, r, 4, layout) for r in range(4)]
        assert torch.equal(unshard_sequence(parts, layout), x)


def test_causal_blocks_above_the_diagonal_are_skipped():
    assert block_pairs(0, 3, 4, "contiguous") == []                     # keys all later
    assert block_pairs(3, 0, 4, "contiguous") == [(0, 0, "full")]
    assert block_pairs(1, 1, 4, "contiguous") == [(0, 0, "diag")]
    # zig-zag: every rank does the same work, 2 cp + 1 chunk pairs over the cp steps
    work = [sum(len(ring_schedule(4)[s][r]["pairs"]) for s in range(4)) for r in range(4)]
    assert work == [9, 9, 9, 9]
    contiguous = [sum(len(ring_schedule(4, "contiguous")[s][r]["pairs"]) for s in range(4))
                  for r in range(4)]
    assert contiguous == [1, 2, 3, 4]


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_and_ulysses_equal_one_process(cp):
    report = compare_attention(cp, CASES, SHAPE)
    assert len(report) == len(CASES) == 8
    for r in report:                        # rtol 1e-5 / atol 1e-6 on outputs and dq, dk, dv
        assert r["close"], r
        b, h, s, d = SHAPE
        formula = (ring_bytes_per_layer if r["method"] == "ring" else ulysses_bytes_per_layer)(
            b, s, h * d, cp, bytes_per_element=4)
        assert r["sent_bytes"] == pytest.approx(formula), r


@pytest.mark.parametrize("kernel", ["blockwise", "flash"])
def test_grouped_query_attention_equals_one_process(kernel):
    b, h, s, d = SHAPE                                  # 4 query heads sharing 2 K/V heads
    ring_cases = [c for c in CASES if c[0] == "ring"]
    for cp, cases in ((2, CASES), (4, ring_cases)):     # Ulysses: cp must divide the 2 K/V heads
        report = compare_attention(cp, cases, SHAPE, kv_heads=2, kernel=kernel)
        assert len(report) == len(cases)
        for r in report:                    # rtol 1e-5 / atol 1e-6 on outputs and dq, dk, dv
            assert r["close"], r
            formula = (ring_bytes_per_layer if r["method"] == "ring" else ulysses_bytes_per_layer)(
                b, s, h * d, cp, bytes_per_element=4, kv_width=2 * d)
            assert r["sent_bytes"] == pytest.approx(formula), r


def _two_shapes_three_calls():
    """Inside a rank: one RingAttention called twice on one shape, then on another; the
    all-gathers (the check) and the K/V messages each call sent."""
    attend, calls = RingAttention(None, "zigzag"), []
    for tokens in (8, 8, 4):
        with record_comm() as log:
            attend(*_qkv([tokens] * 3, seed=dist.get_rank()))
        calls.append((log.calls(kind="all_gather"), log.calls(kind="send")))
    return calls


def test_the_slices_are_checked_once_per_shape():
    for calls in lecture_lib.run(_two_shapes_three_calls, 2, timeout=60):
        assert calls == [(1, 1), (0, 1), (1, 1)]          # 1 K/V hop forward at cp = 2


def test_gpt_trained_with_cp_equals_one_process():
    cfg = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=4, n_layers=2)
    data = MarkovText(cfg.vocab_size, cfg.seq_len)
    ref = train_reference(GPT(cfg, 0), lambda s: data.batch(s, 4), 3, 0.1, "sgd")
    # SGD: updates proportional to gradients; fp32 sums in another order: rtol 1e-5, atol 1e-6
    for cp, layout, method in [(2, "zigzag", "ring"), (4, "contiguous", "ring"),
                               (4, "zigzag", "ring"), (2, "zigzag", "ulysses"),
                               (4, "contiguous", "ulysses")]:
        got = train_context_parallel(cfg, cp, 4, 3, 0.1, "sgd", layout, method, timeout=120)
        assert_same_training(got, ref, rtol=1e-5, atol=1e-6)


def test_zigzag_balances_causal_flops():
    b, h, s, d = 1, 4, 64, 16
    flops = measure_attention_flops(4, (b, h, s, d))
    assert flops["contiguous"] == [ring_attention_flops(b, h, s, d, n, 4) for n in (1, 2, 3, 4)]
    assert flops["zigzag"] == [ring_attention_flops(b, h, s, d, 9, 8)] * 4


def test_activation_memory_per_device_matches_the_count():
    measured = measure_activation_memory([32, 64], 2)
    for s, (one, per_device) in measured.items():
        assert one == gpt_block_activation_bytes(s, 1, 32, 4, 1)
        assert per_device == gpt_block_activation_bytes(s, 1, 32, 4, 2) == one // 2


def test_ring_picture_names_every_held_block():
    labels = cell_labels(4, "contiguous")
    assert labels[1][0] == "K/V of rank 3\nskipped" and labels[0][2].startswith("K/V of rank 2")
    fig = draw_ring_steps(4, "zigzag")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == [c for row in cell_labels(4, "zigzag") for c in row]


def test_ring_overlaps_kv_hops_with_attention_in_emulated_time():
    # The lesson is about the GPU's streams: a hop in flight while the compute stream runs the
    # attention. In eager mode this small ring is launch-bound (the host's 5 us per operation
    # exceeds each kernel), so the GPU waits for the host either way and the host's lag hides
    # the hops even in the serial ring; CUDA graphs (no host cost per kernel) keep the sizes
    # cheap on the CPU and leave the GPU's timeline to show the overlap.
    shape, preset = (1, 4, 256, 32), emulate.preset("h100-node", launch="graphs")
    got = measure_ring_overlap(4, shape, preset=preset)
    again = measure_ring_overlap(4, shape, preset=preset)
    for key in ("overlapped", "serial"):                  # virtual time: exactly repeatable
        assert [r["spans"] for r in got[key]] == [r["spans"] for r in again[key]]
    assert got["step_s"] == again["step_s"] and got["serial_s"] == again["serial_s"]
    assert got["overlap_s"] > 0 and got["step_s"] < got["serial_s"]
    for ov, se in zip(got["overlapped"], got["serial"]):
        assert ov["hops"] == se["hops"] == 3 + 3 + 4      # K/V fwd, K/V bwd, dK/dV home
        # the same hops' durations, summed from different start times (float rounding)
        assert ov["comm_s"] == pytest.approx(se["comm_s"], rel=1e-12) and se["comm_s"] > 0
        assert ov["idle_s"] < se["idle_s"]
        assert se["step_s"] == pytest.approx(se["compute_s"] + se["idle_s"])   # nothing hidden
    plain = lecture_lib.run(attention_on_rank, 4, shape, [("ring", "zigzag", True)], 0)
    for p, ov, se in zip(plain, got["overlapped"], got["serial"]):   # bit-identical results
        for run in (ov, se):
            assert torch.equal(run["o"], p[0]["o"])
            assert all(torch.equal(a, b) for a, b in zip(run["grads"], p[0]["grads"]))


SMALL_LLAMA = GPTConfig(vocab_size=32, seq_len=32, d_model=32, n_heads=4, n_kv_heads=2,
                        n_layers=2, mlp="swiglu")             # GQA and SwiGLU, as Llama 3


@pytest.mark.parametrize("method, layout, kernel", [
    ("ring", "contiguous", "flash"), ("ring", "zigzag", "flash"), ("ring", "zigzag", "blockwise"),
    ("ulysses", "contiguous", "flash"), ("ulysses", "zigzag", "flash")])
def test_the_dry_run_reads_the_real_runs_clock(method, layout, kernel):
    # the rank function of time_at_scale, on a small model: real tensors, then fake ones
    runs = {dry: lecture_lib.run(layers_pass, 2, SMALL_LLAMA, method, layout, kernel, 2,
                                 torch.float32, True, "h100-node", dry, timeout=60)
            for dry in (False, True)}
    for real, dry in zip(runs[False], runs[True]):
        clocks = [{**r["clock"].summary(), "issued": r["clock"].issued} for r in (real, dry)]
        assert clocks[0] == clocks[1]          # now, totals, bytes, spans, issue times
        assert {"forward", "backward"} <= set(clocks[0]["totals"])   # both passes were charged
        assert clocks[0]["comm_bytes"] > 0 and real["end"] > real["forward_end"] > real["start"]


def test_at_real_size_zigzag_balances_and_the_ring_hides_its_hops():
    # one Llama 3 8B layer (GQA, SwiGLU) at 32K tokens on 4 emulated H100s, bf16, flash blocks
    cfg = real_size("Llama 3 8B", n_layers=1, seq_len=32768)
    runs = {(m, lay, ov): time_at_scale(4, m, lay, cfg, overlap=ov)
            for m, lay, ov in [("ring", "zigzag", True), ("ring", "zigzag", False),
                               ("ring", "contiguous", True), ("ulysses", "contiguous", True)]}
    zigzag, waited = runs["ring", "zigzag", True], runs["ring", "zigzag", False]
    contiguous, ulysses = runs["ring", "contiguous", True], runs["ulysses", "contiguous", True]
    assert all(r["wall_seconds"] < 60 for r in runs.values())
    compute = {name: [r["compute"] for r in run["ranks"]]
               for name, run in (("zigzag", zigzag), ("contiguous", contiguous))}
    assert max(compute["zigzag"]) == pytest.approx(min(compute["zigzag"]), rel=1e-9)
    assert max(compute["contiguous"]) > 1.5 * min(compute["contiguous"])   # causal imbalance
    assert zigzag["step"] < contiguous["step"]
    for r in zigzag["ranks"]:
        assert r["exposed_forward"] == 0                  # every forward K/V hop hidden
        assert r["exposed"] < 0.02 * r["step"]            # backward: the dK/dV hops only
    assert waited["step"] > zigzag["step"]                # without overlap the hops add up
    b, s, h, kv = 1, cfg.seq_len, cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    for run, formula in ((zigzag, ring_bytes_per_layer), (ulysses, ulysses_bytes_per_layer)):
        f = formula(b, s, h, 4, bytes_per_element=2, kv_width=kv)
        assert all(r["sent_bytes"] == f["forward"] + f["backward"] for r in run["ranks"])
    assert ulysses["ranks"][0]["sent_bytes"] < zigzag["ranks"][0]["sent_bytes"]
    # Ulysses runs each head's attention as one causal kernel over the whole sequence, at a
    # causal kernel's rate; the ring runs most of the same FLOPs as unmasked blocks, faster,
    # and pays the merging of their partial results instead
    attention = {name: sum(t for op, t in run["ranks"][0]["compute_by_op"].items()
                           if "attention" in op)
                 for name, run in (("ring", zigzag), ("ulysses", ulysses))}
    assert attention["ulysses"] > 1.02 * attention["ring"]
    for run in (zigzag, ulysses):
        r = run["ranks"][0]
        assert 0.9 * r["compute"] < sum(r["compute_by_op"].values()) <= r["compute"] * (1 + 1e-9)


@pytest.mark.parametrize("check, match", [
    (lambda: check_layout(30, 4, "zigzag"), "not divisible by 8"),
    (lambda: check_layout(30, 4, "contiguous"), "not divisible by 4"),
    (lambda: check_layout(32, 2, "stripes"), "layout must be one of"),
    (lambda: check_ulysses(6, 4), "heads divisible by cp"),
    (lambda: compare_attention(4, [("ring", "zigzag", True)], (1, 4, 12, 8)), "divisible by 8"),
    (lambda: compare_attention(3, [("ulysses", "contiguous", True)], (1, 4, 12, 8)),
     "do not split over cp=3"),
    (lambda: train_context_parallel(GPTConfig(seq_len=12), 4, 4, 1), "divisible by 8"),
    (lambda: train_context_parallel(GPTConfig(n_heads=2, d_model=32, seq_len=16), 4, 4, 1,
                                    method="ulysses", layout="contiguous"), "heads divisible"),
    (lambda: measure_ring_overlap(4, (1, 4, 12, 8)), "divisible by 8"),
    (lambda: measure_ring_overlap(2, (1, 4, 16, 8), preset="tpu"), "unknown emulation preset"),
    (lambda: ring_attention(*_qkv([5, 5, 5]), "local", "zigzag"), "even number of tokens"),
    (lambda: ring_attention(*_qkv([8, 6, 8]), "local"),
     r"rank 0: q \(1, 2, 8, 4\), k \(1, 2, 6, 4\)"),
    (lambda: ring_attention(*_qkv([0, 0, 0]), "local", "contiguous"), "at least 1 token"),
    (lambda: ring_attention(*_qkv([8, 8, 8]), "local", "stripes"), "layout must be one of"),
    (lambda: ring_attention(*_qkv([8, 8, 8]), "local", "zigzag", True, "fast"),
     "kernel must be one of"),
    (lambda: make_attention("tree"), "method must be one of"),
    (lambda: check_ulysses(8, 4, 2), "K/V heads divisible by cp"),
    (lambda: flash_block_attention(*(torch.empty(1, 2, 4, 4, device="meta"),) * 3),
     "CPU flash-attention kernel"),
    (lambda: time_at_scale(8, "ulysses", "contiguous", GPTConfig(
        n_heads=8, n_kv_heads=4, d_model=64, seq_len=64)), "4 K/V heads do not split over cp=8"),
])
def test_bad_input_fails_before_any_process_starts(check, match, monkeypatch):
    monkeypatch.setattr(lecture_lib.runtime.launch, "run",
                        lambda *a, **k: pytest.fail("ranks started"))
    with pytest.raises(ValueError, match=match):
        check()


def _qkv(tokens, seed: int = 0):
    """q, k, v of shape (1, 2, tokens[i], 4)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, t, 4, generator=g) for t in tokens]


def _ring_on_slices(q_tokens, k_tokens, layout):
    """Inside a rank: ring attention on this rank's slice; the ValueError it raised (or None)
    and how many K/V messages it had sent by then."""
    rank = dist.get_rank()
    q, k, v = _qkv([q_tokens[rank], k_tokens[rank], q_tokens[rank]], seed=rank)
    with record_comm() as log:
        try:
            ring_attention(q, k, v, None, layout, True)
        except ValueError as exc:
            return str(exc), log.calls(kind="send")
    return None, log.calls(kind="send")


@pytest.mark.parametrize("q_tokens, k_tokens, layout, match", [
    ([5, 5], [5, 5], "zigzag", r"even number of tokens per rank .*not 5"),
    ([8, 6], [8, 6], "zigzag", r"rank 0: 8 tokens .*rank 1: 6 tokens"),
    ([8, 6], [8, 6], "contiguous", r"rank 0: 8 tokens .*rank 1: 6 tokens"),
    ([7, 8], [7, 8], "zigzag", r"rank 0: 7 tokens .*rank 1: 8 tokens"),
    ([8, 8], [8, 6], "zigzag", r"rank 1: q \(1, 2, 8, 4\), k \(1, 2, 6, 4\)"),   # rank 1 alone
])
def test_ring_refuses_bad_slices_on_every_rank_before_any_kv_message(q_tokens, k_tokens, layout,
                                                                    match):
    results = lecture_lib.run(_ring_on_slices, 2, q_tokens, k_tokens, layout, timeout=60)
    for rank, (error, sends) in enumerate(results):
        assert error is not None, f"rank {rank} did not raise"
        assert re.search(match, error), (rank, error)
        assert sends == 0, (rank, sends)                      # no K/V block left its rank
    assert results[0][0] == results[1][0]                     # every rank says the same


def test_a_zigzag_slice_of_odd_length_fails_the_run_with_the_reason():
    with pytest.raises(lecture_lib.RankError, match=r"raised ValueError: .*even number of tokens"):
        lecture_lib.run(_ring_on_rank_unguarded, 2, 5, timeout=60)


def _ring_on_rank_unguarded(tokens):
    return ring_attention(*_qkv([tokens] * 3), None, "zigzag", True)


def test_torch_context_parallel_runs_or_says_what_fails():
    # torch 2.13 on CPU: its CP dispatches only the CUDA SDPA kernels; the CPU flash kernel has
    # no sharding strategy, so we record the error (the notebook prints it) instead of a result
    for r in compare_with_torch(2):
        if r["ran"]:
            assert r["max_abs_err"] < 1e-5, r
        else:
            assert r["error"].startswith(("NotImplementedError", "RuntimeError")), r
