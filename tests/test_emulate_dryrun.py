"""lecture_lib.emulate: the dry run (fake tensors) and the batched agreement on collective times.

The dry run must read the same clock as the real run, to the last bit: the
same operations are charged, the same collectives and messages agree on the
same times. The batched agreement must give the times one agreement per
collective gives (start = the latest rank's ready time, or the end of the
collective before it), with one real all-reduce for a whole batch.
"""
import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import data_parallel as DP
from lecture_lib import emulate
from lecture_lib import tensor_parallel as TP
from lecture_lib.emulate import comm as emulated_comm
from lecture_lib.models import GPT, Block, GPTConfig, lm_loss

SMALL = GPTConfig(vocab_size=64, seq_len=32, d_model=64, n_heads=4, n_layers=2)
GPT2 = GPTConfig(vocab_size=50304, seq_len=1024, d_model=768, n_heads=12, n_layers=12)


def _clock(clock) -> dict:
    """Everything the clock knows (now, totals, bytes, spans, issue times)."""
    return {**clock.summary(), "issued": list(clock.issued)}


# ----------------------------------------------------------------------------
# The dry run reads the real run's clock
# ----------------------------------------------------------------------------

def _ddp_step(cfg, batch, variant):
    """One DDP step; the model and the data are made inside the block (fake in a dry run)."""
    x = torch.randint(cfg.vocab_size, (batch, cfg.seq_len),
                      generator=torch.Generator().manual_seed(dist.get_rank()))
    model = GPT(cfg, seed=0).to(lecture_lib.device())          # moving a fake model works too
    ddp = DP.DDPBucketed(model, 0.05) if variant == "bucketed" else DP.DDPFlat(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = lm_loss(ddp(x), x)
    loss.backward()
    ddp.finish_gradient_synchronization()
    opt.step()
    return loss


def _tensor_parallel_layer(cfg, batch):
    """The course's tensor-parallel transformer layer (its layer norms deep-copied to every
    rank), forward and backward."""
    layer = TP.ParallelBlock(Block(cfg))
    x = torch.randn(batch, cfg.seq_len, cfg.d_model, requires_grad=True)
    layer(x).square().mean().backward()
    return x.grad


def _messages(n):
    """Blocking and asynchronous messages both ways, the second rank late by a matmul."""
    x, a = torch.ones(n), torch.randn(256, 256)
    me, peer = dist.get_rank(), 1 - dist.get_rank()
    if me == 1:
        a @ a
    if me == 0:
        dist.send(x, peer)
    else:
        dist.recv(x, peer)
    ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, torch.empty(n), peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return x


def _real_and_dry(fn, *args):
    out = {}
    for dry_run in (False, True):
        with emulate.emulated("h100-node", dry_run=dry_run) as clock:
            result = fn(*args)
        out[dry_run] = (_clock(clock), type(result).__name__)
    return out


@pytest.mark.parametrize("case", ["ddp bucketed", "ddp flat", "tensor parallel", "messages"])
def test_the_dry_run_reads_the_real_runs_clock_exactly(case):
    fn, args = {"ddp bucketed": (_ddp_step, (SMALL, 4, "bucketed")),
                "ddp flat": (_ddp_step, (SMALL, 4, "flat")),
                "tensor parallel": (_tensor_parallel_layer, (SMALL, 2)),
                "messages": (_messages, (1 << 12,))}[case]
    for rank in lecture_lib.run(_real_and_dry, 2, fn, *args, timeout=120):
        (real, real_type), (dry, dry_type) = rank[False], rank[True]
        assert (real_type, dry_type) == ("Tensor", "FakeTensor")    # nothing was computed
        assert real["now"] > 0 and real["comm_bytes"] > 0
        assert dry == real                    # now, totals, bytes, spans, issue times


def test_gpt2_small_ddp_step_runs_dry_on_two_ranks_within_a_minute():
    # 124M parameters, 8 x 1024 tokens per rank: fake tensors, so no memory and no FLOPs spent
    n = (GPT2.vocab_size + GPT2.seq_len) * GPT2.d_model + GPT2.n_layers * (
        12 * GPT2.d_model ** 2 + 13 * GPT2.d_model) + 2 * GPT2.d_model \
        + GPT2.d_model * GPT2.vocab_size
    for out in emulate.run(_ddp_step, 2, GPT2, 8, "bucketed", dry_run=True, timeout=60):
        assert out.result.device.type == "meta" and out.result.shape == ()   # the loss's shape
        assert out.clock.bytes_by_kind["all_reduce"] == 4 * n   # every gradient, once
        assert 1e-3 < out.clock.now() < 1.0                     # emulated seconds of one step


def _item_of_a_fake():
    with emulate.emulated("h100-node", dry_run=True):
        torch.ones(3).sum().item()


def test_a_value_cannot_be_read_in_a_dry_run():
    with pytest.raises(RuntimeError, match="the dry run has no values"):
        _item_of_a_fake()
    assert emulate.current() is None and dist.all_reduce.__name__ == "all_reduce"


@pytest.mark.parametrize("bad", ["yes", 1, None, 0.0])
def test_bad_dry_run_is_refused_before_any_process_starts(monkeypatch, bad):
    monkeypatch.setattr(lecture_lib.runtime.launch, "run",
                        lambda *a, **k: pytest.fail("ranks started"))
    with pytest.raises(TypeError, match="dry_run must be True or False"):
        emulate.run(_ddp_step, 2, SMALL, 4, "flat", dry_run=bad)
    with pytest.raises(TypeError, match="dry_run must be True or False"):
        with emulate.emulated("h100-node", dry_run=bad):
            pass
    assert emulate.current() is None


def _fake_result():
    return torch.zeros(5, 3)


def test_emulate_run_returns_a_dry_runs_tensors_as_meta():
    for out in emulate.run(_fake_result, 2, dry_run=True, timeout=60):
        assert out.dry_run and out.result.device.type == "meta" and out.result.shape == (5, 3)


# ----------------------------------------------------------------------------
# Batched agreement: one all-reduce for many asynchronous collectives
# ----------------------------------------------------------------------------

def _counting(calls):
    original = emulated_comm.ORIGINAL["all_reduce"]

    def counted(tensor, *args, **kwargs):
        calls.append(tensor.dtype)
        return original(tensor, *args, **kwargs)
    return original, counted


def _async_batch(n, uneven):
    """``n`` asynchronous collectives, rank-dependent compute between them, waited at the end.
    Returns the spans, issue records, and how many real all-reduces of each dtype ran."""
    me, p = dist.get_rank(), dist.get_world_size()
    a = torch.randn(64 * (1 + me), 64 * (1 + me))       # a rank-dependent matmul
    calls: list = []
    with emulate.emulated("h100-node") as clock:
        original, emulated_comm.ORIGINAL["all_reduce"] = _counting(calls)   # once installed
        try:
            works = []
            for i in range(n):
                a @ a
                if uneven:                                # every rank sends a different amount
                    send = [1000 * (1 + (me + j + i) % 3) for j in range(p)]
                    recv = [1000 * (1 + (j + me + i) % 3) for j in range(p)]
                    works.append(dist.all_to_all_single(torch.empty(sum(recv)),
                                                        torch.ones(sum(send)), recv, send,
                                                        async_op=True))
                else:
                    works.append(dist.all_reduce(torch.ones(1000 * (i + 1)), async_op=True))
            for work in works:
                work.wait()
        finally:
            emulated_comm.ORIGINAL["all_reduce"] = original
    spans = [(s, e) for kind, s, e, _ in clock.spans if kind == "comm"]
    return spans, list(clock.issued), calls


@pytest.mark.parametrize("uneven", [False, True])
def test_a_batch_of_async_collectives_agrees_once_on_the_per_collective_times(uneven):
    n, p = 6, 3
    runs = lecture_lib.run(_async_batch, p, n, uneven, timeout=120)
    h100 = emulate.preset("h100-node")
    ranks = list(range(p))
    # one agreement per collective: start_k = max(latest rank's ready time, end of k-1 on the
    # slowest rank); ready = the compute stream at the issue (the comm stream starts free)
    costs = [[h100.collective_seconds(kind, nbytes, ranks) for kind, _, nbytes in r[1]]
             for r in runs]
    end = 0.0
    for k in range(n):
        start = max(max(r[1][k][1] for r in runs), end)
        for rank, (spans, _, _) in enumerate(runs):
            assert spans[k] == (start, start + costs[rank][k])
        end = max(start + c[k] for c in costs)
    for _, _, calls in runs:
        # the data (float32, none for all-to-all) and ONE float64 agreement for all n
        assert calls.count(torch.float64) == 1
        assert calls.count(torch.float32) == (0 if uneven else n)


def _disagreeing():
    """Rank 0 waits for its first collective before issuing the second; rank 1 after."""
    x, y = torch.ones(8), torch.ones(8)       # 32 bytes: as many as rank 0's agreement vector
    with emulate.emulated("h100-node"):
        first = dist.all_reduce(x, async_op=True)
        if dist.get_rank() == 0:
            first.wait()
        second = dist.all_reduce(y, async_op=True)
        first.wait()
        second.wait()


def test_ranks_that_agree_at_different_places_fail_loudly():
    with pytest.raises(lecture_lib.RankError, match="same place"):
        lecture_lib.run(_disagreeing, 2, timeout=60)
