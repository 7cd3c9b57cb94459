"""ex07: exchange(), the step that sends an activation forward and a gradient back,
alone (what it receives, and what it posts and waits for, in order) and inside the real
pipeline executor (equal to one-process training)."""
import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import pipeline as pp
from lecture_lib.grading import assert_close_per_rank, load_exercise
from lecture_lib.grading.harness import difference, record_dist
from lecture_lib.models import GPT, GPTConfig, MarkovText, lm_loss
from lecture_lib.pipeline import experiments as ppx

ex = load_exercise("ex07")
POINTS = 10
CFG = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=2, n_layers=4)


def _exchange_recorded(sends, recvs):
    """exchange(sends, recvs) on this rank: its requests, and what it did, in order: the
    messages it posted ("send", "recv") and the requests it waited for ("wait send", ...)."""
    with record_dist(waits=True) as events:
        requests = ex.exchange(sends, recvs)
        did = [e["kind"] if e["kind"] != "wait" else f"wait {e['of']}" for e in events]
    return requests, did


def _finish(requests, did, recvs):
    """Wait for the sends' requests, as the executor does, unless exchange already did (a
    gloo request waited twice never returns) or left a receive unwaited (then a send to it
    may never complete)."""
    if "wait send" not in did and did.count("wait recv") >= recvs:
        for r in requests:
            if getattr(r, "_kind", "send") == "send":
                r.wait()


def _both_directions():
    """Stage 0 sends an activation forward while stage 1 sends a gradient back."""
    rank = dist.get_rank()
    peer = 1 - rank
    mine = torch.full((3, 4), float(rank + 1))
    got = torch.zeros(3, 4)
    requests, did = _exchange_recorded([(mine, peer)], [(got, peer)])
    received = got.clone()                      # the receive must be complete now
    _finish(requests, did, 1)
    empty = ex.exchange([], [])
    return {"received": received, "requests": len(requests), "empty": empty, "did": did,
            "sends": 1, "recvs": 1}


def _chain():
    """Three stages: the middle one receives from both sides and sends to both."""
    rank = dist.get_rank()
    left, right = torch.zeros(2), torch.zeros(2)
    sends, recvs = [], []
    if rank > 0:
        sends.append((torch.full((2,), 10.0 + rank), rank - 1))
        recvs.append((left, rank - 1))
    if rank < 2:
        sends.append((torch.full((2,), 20.0 + rank), rank + 1))
        recvs.append((right, rank + 1))
    requests, did = _exchange_recorded(sends, recvs)
    _finish(requests, did, len(recvs))
    return {"left": left, "right": right, "did": did, "sends": len(sends), "recvs": len(recvs)}


_RESULTS = {}
HANG = ("exchange, or the wait for the sends it returned, never returned on some rank (the "
        "stacks below say where each rank was): a blocking send waits for its receiver, and "
        "where both neighbours send first, neither ever receives; a request waited twice "
        "never returns (do not wait for the sends whose requests you return); a receive "
        "never waited leaves its sender waiting. Post every send and receive at once, as one "
        "batch (dist.batch_isend_irecv), then wait for the receives only")


def _results(case):
    """One run per case serves every test; a failure is raised again, not rerun."""
    if case not in _RESULTS:
        fn, world_size = {"both": (_both_directions, 2), "chain": (_chain, 3)}[case]
        try:
            _RESULTS[case] = ex.run(fn, world_size, timeout=30)
        except lecture_lib.RankTimeout as exc:
            _RESULTS[case] = AssertionError(f"{HANG}\n{exc}")
        except lecture_lib.RankError as exc:
            _RESULTS[case] = exc
    if isinstance(_RESULTS[case], Exception):
        raise _RESULTS[case]
    return _RESULTS[case]


def test_send_and_receive_in_one_batch():
    """Both ranks send to and receive from each other at once; the send requests come back."""
    results = _results("both")
    assert_close_per_rank([res["received"] for res in results],
                          [torch.full((3, 4), float(2 - rank)) for rank in range(2)],
                          "the buffer each rank received from the other (complete when "
                          "exchange returns)")
    for rank, res in enumerate(results):
        assert res["requests"] == 1, (f"rank {rank}: return the requests of the sends (one per "
                                      f"send): expected 1, got {res['requests']}")
        assert res["empty"] == [], f"rank {rank}: nothing to do should return [], got " \
            f"{res['empty']!r}"


def test_middle_stage_talks_to_both_neighbours():
    """The middle of three ranks sends to and receives from both sides in one exchange."""
    results = _results("chain")
    # rank r's left buffer holds what rank r-1 sent right (20 + r-1), its right buffer what
    # rank r+1 sent left (10 + r+1); an end of the chain receives nothing on its open side
    assert_close_per_rank([res["left"] for res in results],
                          [torch.zeros(2), torch.full((2,), 20.0), torch.full((2,), 21.0)],
                          "the buffer received from the left neighbour")
    assert_close_per_rank([res["right"] for res in results],
                          [torch.full((2,), 11.0), torch.full((2,), 12.0), torch.zeros(2)],
                          "the buffer received from the right neighbour")


@pytest.mark.weight(2.5)
@pytest.mark.parametrize("case", ["both", "chain"])
def test_posts_everything_then_waits_for_the_receives_only(case):
    """What exchange does, in order: every send and receive posted before any wait (one
    batch), then a wait on each receive, and none on a send (the executor waits for those)."""
    for rank, res in enumerate(_results(case)):
        did = res["did"]
        seen = " -> ".join(did) or "nothing"
        posted = [d for d in did if d in ("send", "recv")]
        assert (posted.count("send"), posted.count("recv")) == (res["sends"], res["recvs"]), (
            f"rank {rank}: exchange posted {posted.count('send')} sends and "
            f"{posted.count('recv')} receives ({seen}); expected {res['sends']} and "
            f"{res['recvs']}, one per message")
        last_post = max(i for i, d in enumerate(did) if d in ("send", "recv"))
        early = [d for d in did[:last_post] if d.startswith("wait")]
        assert not early, (
            f"rank {rank}: exchange waited ({early[0]}) before posting all its messages "
            f"({seen}): post every send and receive first, as one batch "
            "(dist.batch_isend_irecv), so that neither neighbour waits for the other to go "
            "first")
        assert "wait send" not in did, (
            f"rank {rank}: exchange waited for its sends ({seen}): return their requests "
            "instead; the executor waits for them at the end of the step (a send that waits "
            "for its receiver can deadlock a schedule whose receiver first needs something "
            "else)")
        assert did.count("wait recv") == res["recvs"], (
            f"rank {rank}: exchange did not wait for its receives ({did.count('wait recv')} "
            f"of {res['recvs']} waited: {seen}): the next action reads the buffers, so wait "
            "for every receive's request before returning")


def _train_with_student_exchange(schedules):
    return [ppx.train_stage(s, CFG, 8, 1, exchange=ex.exchange) for s in schedules]


@pytest.mark.parametrize("p", [2])
def test_pipeline_training_equals_one_process(p):
    """1F1B and interleaved 1F1B with this exchange: the loss and every gradient of one
    process."""
    model = GPT(CFG, 0)
    x, y = MarkovText(CFG.vocab_size, CFG.seq_len).batch(0, 8)
    loss = lm_loss(model(x), y)
    loss.backward()
    schedules = [pp.make_schedule("1f1b", p, 4), pp.make_schedule("interleaved-1f1b", p, 4, 2)]
    try:
        per_rank = ex.run(_train_with_student_exchange, p, schedules, timeout=60)
    except lecture_lib.RankTimeout as exc:
        raise AssertionError(f"{HANG}\n{exc}") from None
    for i, s in enumerate(schedules):
        run = ppx.merge(s, [r[i] for r in per_rank])
        assert run.losses[0] == pytest.approx(loss.item(), rel=1e-5), (
            f"{s.name}: the pipeline's loss {run.losses[0]:.6g} differs from one process's "
            f"{loss.item():.6g}")
        for name, param in model.named_parameters():
            try:
                torch.testing.assert_close(run.grads[name], param.grad, rtol=1e-5, atol=1e-6)
            except AssertionError as exc:
                raise AssertionError(
                    f"{s.name}: the gradient of {name} differs from one process's (a buffer "
                    "read before its receive completed?): "
                    + difference(run.grads[name], param.grad, exc, rtol=1e-5, atol=1e-6)
                ) from None
