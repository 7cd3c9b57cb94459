"""lecture_lib.comm: group info, the flat all-reduce (equal to one all-reduce per tensor),
the shims, and the recorder: off, it times nothing; on, it records every call's bytes."""
import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import comm, observe
from lecture_lib.data_parallel import ddp as DDP
from lecture_lib.models import GPT, GPTConfig, MarkovText

CFG = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=1)


def _tensors(rank):
    """Whole numbers: sums are exact whatever order gloo adds in, and so are halves and
    quarters, so flat and per-tensor results must agree bit for bit on 2 and 4 ranks."""
    g = torch.Generator().manual_seed(rank)
    def ints(*shape):
        return torch.randint(-50, 50, shape, generator=g).float()
    return [ints(3, 4), None, ints(5), ints(4, 3).t(), None]   # a non-contiguous view too


# -- one process, no torch.distributed -----------------------------------------

def test_group_info_without_a_process_group():
    assert not dist.is_initialized()
    assert comm.group_info() == (0, 1) and comm.group_info(comm.LOCAL) == (0, 1)
    assert comm.resolve(comm.LOCAL) == (None, 0, 1)
    with pytest.raises(RuntimeError, match="no process group"):
        comm.group_info(required=True)
    assert comm.group_info(comm.LOCAL, required=True) == (0, 1)


def test_all_reduce_flat_on_one_process_changes_nothing():
    ts = _tensors(0)
    before = [t.clone() for t in ts if t is not None]
    assert comm.all_reduce_flat(ts, comm.LOCAL, average=True) is None
    assert comm.all_reduce_flat([None, None]) is None
    finish = comm.all_reduce_flat(ts, async_op=True)
    assert callable(finish) and finish() is None
    for t, b in zip([t for t in ts if t is not None], before):
        assert torch.equal(t, b)


def _no_clock(*args, **kwargs):
    raise AssertionError("timed although no recorder is on")


def test_the_recorder_off_reads_no_clock(monkeypatch):
    monkeypatch.setattr(observe, "now", _no_clock)
    assert not comm.recording()
    with comm.collective("all_reduce", 64, 4, "grads"):
        pass                                      # ran without touching the clock
    with pytest.raises(AssertionError, match="timed although"), comm.record_comm():
        with comm.collective("all_reduce", 64, 4):   # the patch is the path timing takes
            pass


def test_the_recorder_on_keeps_every_call_in_every_open_log():
    with comm.record_comm() as outer:
        with comm.collective("all_reduce", 1000, 4, "grads"):
            pass
        with comm.record_comm() as inner:
            assert comm.recording()
            with comm.collective("all_gather", 400, 2, "forward"):
                pass
    assert not comm.recording()
    assert outer.calls() == 2 and inner.calls() == 1
    assert outer.buffer_bytes("grads") == 1000 and outer.buffer_bytes(kind="all_gather") == 400
    assert outer.sent_bytes() == pytest.approx(1000 * 2 * 3 / 4 + 400 * 1 / 2)
    assert outer.summary() == {"grads": {"all_reduce": (1, 1000)},
                               "forward": {"all_gather": (1, 400)}}
    assert all(r.seconds >= 0 for r in outer.records)


# -- on ranks -------------------------------------------------------------------

def _flat_against_per_tensor():
    rank, p = dist.get_rank(), dist.get_world_size()
    out = {}
    for average in (False, True):
        for async_op in (False, True):
            ours, ref = _tensors(rank), _tensors(rank)
            finish = comm.all_reduce_flat(ours, average=average, async_op=async_op)
            if async_op:
                finish()
            ref = [None if t is None else t.contiguous() for t in ref]
            for t in ref:
                if t is not None:
                    dist.all_reduce(t)
                    if average:
                        t.div_(p)
            out[(average, async_op)] = (ours, ref)
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_reduce_flat_equals_one_all_reduce_per_tensor(world_size):
    for result in lecture_lib.run(_flat_against_per_tensor, world_size, timeout=60):
        for ours, ref in result.values():
            for a, b in zip(ours, ref):
                if b is None:
                    assert a is None
                else:
                    torch.testing.assert_close(a, b, rtol=0, atol=0)


def _ddp_step(variant, model, batch):
    ddp = DDP.wrap(variant, model, bucket_size_mb=0.002)
    ddp.on_train_batch_start()
    ddp(*batch).backward()
    ddp.finish_gradient_synchronization()
    return ddp


def _recorder_on_ranks():
    p = dist.get_world_size()
    batch = MarkovText(CFG.vocab_size, CFG.seq_len, seed=1).batch(dist.get_rank(), 4)
    saved = observe.now
    observe.now = _no_clock                   # restored below: the worker serves more calls
    try:
        for variant in ("naive", "flat", "individual", "bucketed"):
            _ddp_step(variant, GPT(CFG, seed=0), batch)      # no recorder: no clock read
        comm.all_gather_into(torch.empty(2 * p), torch.ones(2))
        comm.reduce_scatter_into(torch.empty(2), torch.ones(2 * p))
    finally:
        observe.now = saved
    out = {}
    grad_bytes = sum(q.numel() * 4 for q in GPT(CFG).parameters())
    for variant in ("naive", "flat", "individual", "bucketed"):
        with comm.record_comm() as log:
            ddp = _ddp_step(variant, GPT(CFG, seed=0), batch)
        out[variant] = (log.calls("grads", "all_reduce"), log.buffer_bytes("grads"),
                        len(getattr(ddp, "buckets", [])), len(ddp.params))
    with comm.record_comm() as log:
        comm.all_reduce_flat([torch.ones(3), None, torch.ones(2, 2)], phase="mine")
        comm.all_gather_into(torch.empty(2 * p), torch.ones(2), phase="ag")
        comm.reduce_scatter_into(torch.empty(2), torch.ones(2 * p), phase="rs")
    out["moves"] = log.summary()
    return out, grad_bytes, p


def test_recorder_off_times_nothing_and_on_records_every_all_reduce():
    out, grad_bytes, p = lecture_lib.run(_recorder_on_ranks, 2, timeout=120)[0]
    n_params = out["naive"][3]
    assert out["naive"][:2] == (n_params, grad_bytes)          # one call per parameter
    assert out["individual"][:2] == (n_params, grad_bytes)
    assert out["flat"][:2] == (1, grad_bytes)                  # one flat buffer
    calls, nbytes, buckets, _ = out["bucketed"]
    assert calls == buckets > 1 and nbytes == grad_bytes       # one call per bucket
    assert out["moves"] == {"mine": {"all_reduce": (1, 7 * 4)},
                            "ag": {"all_gather": (1, 2 * p * 4)},
                            "rs": {"reduce_scatter": (1, 2 * p * 4)}}
