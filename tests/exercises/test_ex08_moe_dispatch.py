"""ex08: dispatch and combine with all-to-all. Run against solutions/ by default;
the grader points LECTURE_EXERCISE_PATH at a student's file."""
import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib.grading import load_exercise
from lecture_lib.grading.harness import assert_close_per_rank, difference, record_dist

ex = load_exercise("ex08")
POINTS = 10
TOKENS, D, EXPERTS = 24, 5, 4
ROW = D * 8                     # bytes of one token (float64); no count table is a multiple


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
    """Each rank receives exactly the tokens of its own experts (from every rank), each row
    labelled with its global expert index."""
    x_all, idx_all = _tokens()
    local = EXPERTS // world_size
    for rank, res in enumerate(_results(world_size)):
        got_e = res["received_expert"]
        assert got_e.shape[0] == res["received"].shape[0], (
            f"rank {rank}: {res['received'].shape[0]} rows received but {got_e.shape[0]} "
            "expert indices: received_expert needs one global expert index per received row")
        others = sorted(set(got_e[(got_e < rank * local) | (got_e >= (rank + 1) * local)]
                            .tolist()))
        assert not others, (f"rank {rank} holds experts {rank * local}..{(rank + 1) * local - 1}"
                            f" but received rows labelled with experts {others}")
        for e in range(rank * local, (rank + 1) * local):
            want, got = int((idx_all == e).sum()), int((got_e == e).sum())
            assert got == want, (f"rank {rank}: expected {want} rows for expert {e} (every "
                                 f"rank's tokens that chose it), got {got}")
            rows, expected = _sorted_rows(res["received"][got_e == e]), _sorted_rows(
                x_all[idx_all == e])
            assert torch.equal(rows, expected), (
                f"rank {rank}: the rows labelled expert {e} are not the tokens that chose "
                f"expert {e} (compared as sets of rows): {difference(rows, expected)}")


@pytest.mark.weight(1.5)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_combine_returns_outputs_in_token_order(world_size):
    """Row i of combine's output is token i's expert output (expert e multiplies by e + 1),
    back in this rank's original token order; x is left unchanged."""
    x_all, idx_all = _tokens()
    n = TOKENS // world_size
    results = _results(world_size)
    expected = [x_all[r * n:(r + 1) * n] * (idx_all[r * n:(r + 1) * n] + 1).unsqueeze(1).double()
                for r in range(world_size)]
    assert_close_per_rank([res["y"] for res in results], expected,
                          "combine's output (row i: token i's expert output, in the original "
                          "token order; undo the sort by expert)", rtol=0, atol=0)
    for rank, res in enumerate(results):
        assert res["unchanged"], f"rank {rank}: dispatch changed its input x"


@pytest.mark.parametrize("world_size", [2, 4])
def test_gradient_flows_back_through_both_all_to_alls(world_size):
    """dL/dx for L = sum((rank + 1) * y): token i's gradient is (rank + 1) * (e_i + 1)."""
    _, idx_all = _tokens()
    n = TOKENS // world_size
    results = _results(world_size)
    for rank, res in enumerate(results):
        assert res["x_grad"] is not None, (
            f"rank {rank}: no gradient reached x: move the tokens with lecture_lib."
            "expert_parallel.all_to_all, which autograd can go back through")
    expected = [((idx_all[r * n:(r + 1) * n] + 1).double() * (r + 1)).unsqueeze(1).expand(n, D)
                for r in range(world_size)]
    assert_close_per_rank([res["x_grad"] for res in results], expected,
                          "the gradient of x (token i's: (rank + 1) * (its expert + 1), come "
                          "back through combine's and dispatch's all-to-alls)", rtol=0, atol=0)


def _is_tokens(event):
    """A call that moves tokens: it carries whole token rows (D float64 = 40 bytes each) in or
    out. The count table, of any dtype or shape the statement allows (at most p x E numbers),
    is never a multiple of a row, so it is told apart by what it is, not by its dtype."""
    return (event["bytes"] or event["input"]) and not event["bytes"] % ROW \
        and not event["input"] % ROW


@pytest.mark.weight(2.5)
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
            tokens = [e for e in events if _is_tokens(e)]
            kinds = sorted({e["kind"] for e in tokens})
            got = sum(e["bytes"] for e in tokens)
            where = f"rank {rank}, {world_size} ranks: {phase}"
            assert kinds == ["all_to_all"], (
                f"{where} moved the tokens with {kinds or 'nothing'}; expected "
                "all-to-all (lecture_lib.expert_parallel.all_to_all), which sends each token "
                "only to the rank that needs it"
                + (" (an all-gather sends every token to every rank: p times the bytes)"
                   if "all_gather" in kinds else ""))
            assert got == rows * ROW, (
                f"{where} received {got // ROW} token rows ({got} bytes) by all-to-all, "
                f"expected {rows} ({rows} x {D} float64 = {rows * ROW} bytes): each token "
                "travels once, to its expert's rank in dispatch and back to its own rank in "
                "combine, and to no other rank")
            rest = sum(e["bytes"] + e["input"] for e in events if e not in tokens)
            assert rest <= 2 * world_size * EXPERTS * 8, (
                f"{where} moved {rest} bytes besides the tokens; only the count table (at most "
                f"p x E = {world_size * EXPERTS} numbers) need travel")
