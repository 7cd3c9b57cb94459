"""ex08: dispatch and combine with all-to-all. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file."""
import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib.grading import load_exercise
from lecture_lib.grading.harness import record_dist

ex = load_exercise("ex08")
POINTS = 10
TOKENS, D, EXPERTS = 24, 5, 4


def _tokens():
    """The global batch; rank 0's tokens never choose the last expert (a zero split)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS, D, generator=g, dtype=torch.float64)
    idx = torch.randint(EXPERTS, (TOKENS,), generator=g)
    idx[:TOKENS // 4] = torch.randint(EXPERTS - 1, (TOKENS // 4,), generator=g)
    return x, idx


def _on_rank():
    rank, p = dist.get_rank(), dist.get_world_size()
    x_all, idx_all = _tokens()
    rows = slice(rank * TOKENS // p, (rank + 1) * TOKENS // p)
    dev = lecture_lib.device()
    x = x_all[rows].clone().to(dev).requires_grad_()
    before = x.detach().clone()
    with record_dist() as sent_out:
        received, received_expert, plan = ex.dispatch(x, idx_all[rows].to(dev), EXPERTS)
    # expert e: multiply by (e + 1), so every token's output says which expert ran it
    processed = received * (received_expert + 1).unsqueeze(1).to(received.dtype)
    with record_dist() as sent_back:
        y = ex.combine(processed, plan)
    (y * (rank + 1)).sum().backward()
    return {"received": received.detach(), "received_expert": received_expert,
            "y": y.detach(), "x_grad": None if x.grad is None else x.grad.cpu(),
            "unchanged": torch.equal(x.detach(), before),
            "moved": {"dispatch": sent_out, "combine": sent_back}}


_RESULTS = {}


def _results(world_size):
    """One run per world size serves every test; a failure is raised again, not rerun."""
    if world_size not in _RESULTS:
        try:
            _RESULTS[world_size] = ex.run(_on_rank, world_size, timeout=60)
        except lecture_lib.RankError as exc:
            _RESULTS[world_size] = exc
    if isinstance(_RESULTS[world_size], Exception):
        raise _RESULTS[world_size]
    return _RESULTS[world_size]


def _sorted_rows(t):
    return t[t[:, 0].argsort()]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_dispatch_sends_each_token_to_its_experts_rank(world_size):
    x_all, idx_all = _tokens()
    local = EXPERTS // world_size
    for rank, res in enumerate(_results(world_size)):
        got_e = res["received_expert"]
        assert got_e.shape[0] == res["received"].shape[0], "one expert index per received row"
        assert ((got_e >= rank * local) & (got_e < (rank + 1) * local)).all(), \
            f"rank {rank} received tokens of another rank's expert"
        for e in range(rank * local, (rank + 1) * local):
            want, got = int((idx_all == e).sum()), int((got_e == e).sum())
            assert got == want, f"rank {rank}: expected {want} rows for expert {e}, got {got}"
            torch.testing.assert_close(_sorted_rows(res["received"][got_e == e]),
                                       _sorted_rows(x_all[idx_all == e]),
                                       msg=f"tokens of expert {e} on rank {rank}")


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_combine_returns_outputs_in_token_order(world_size):
    x_all, idx_all = _tokens()
    n = TOKENS // world_size
    for rank, res in enumerate(_results(world_size)):
        rows = slice(rank * n, (rank + 1) * n)
        expected = x_all[rows] * (idx_all[rows] + 1).unsqueeze(1).double()
        torch.testing.assert_close(res["y"], expected, rtol=0, atol=0, msg=f"rank {rank}")
        assert res["unchanged"], f"rank {rank}: dispatch changed its input"


@pytest.mark.parametrize("world_size", [2, 4])
def test_gradient_flows_back_through_both_all_to_alls(world_size):
    _, idx_all = _tokens()
    n = TOKENS // world_size
    for rank, res in enumerate(_results(world_size)):
        idx = idx_all[rank * n:(rank + 1) * n]
        expected = ((idx + 1).double() * (rank + 1)).unsqueeze(1).expand(n, D)
        assert res["x_grad"] is not None, "no gradient reached x: use the differentiable all_to_all"
        torch.testing.assert_close(res["x_grad"], expected, rtol=0, atol=0, msg=f"rank {rank}")


@pytest.mark.parametrize("world_size", [2, 4])
def test_tokens_travel_once_by_all_to_all(world_size):
    """Each token crosses once each way in an all-to-all: a rank receives exactly the rows of
    its experts (dispatch) and its own rows back (combine); only the small count table may
    travel besides. All-gathering the tokens instead moves p times the bytes."""
    _, idx_all = _tokens()
    local, n = EXPERTS // world_size, TOKENS // world_size
    for rank, res in enumerate(_results(world_size)):
        mine = int(((idx_all >= rank * local) & (idx_all < (rank + 1) * local)).sum())
        for phase, rows in (("dispatch", mine), ("combine", n)):
            events = res["moved"][phase]
            tokens = [e for e in events if "torch.float64" in e["dtypes"]]
            kinds = sorted({e["kind"] for e in tokens})
            got = sum(e["bytes"] for e in tokens)
            assert kinds == ["all_to_all"], (
                f"rank {rank}, {world_size} ranks: {phase} moved the tokens with "
                f"{kinds or 'nothing'}; expected one all-to-all (lecture_lib.expert_parallel."
                "all_to_all), which sends each token only to the rank that needs it")
            assert got == rows * D * 8, (
                f"rank {rank}, {world_size} ranks: {phase} received {got} bytes of tokens, "
                f"expected {rows} rows x {D} x 8 = {rows * D * 8}: each token travels once, to "
                "its expert's rank and back (an all-gather sends every token to every rank)")
            rest = sum(e["bytes"] + e["input"] for e in events if e not in tokens)
            assert rest <= 2 * world_size * EXPERTS * 8, (
                f"rank {rank}, {world_size} ranks: {phase} moved {rest} bytes besides the "
                f"tokens; only the count table (p x E/p numbers) need travel")
