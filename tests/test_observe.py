"""lecture_lib.observe: the one hook that watches an algorithm (spans and notes)."""
import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import comm, emulate, observe


def _no_clock(*args, **kwargs):
    raise AssertionError("a clock was read though nobody watches")


def test_nobody_watching_reads_no_clock_and_keeps_nothing(monkeypatch):
    monkeypatch.setattr(observe, "now", _no_clock)
    assert not observe.watching()
    with observe.span("dispatch", kind="x"):
        observe.note("routing", tokens=3)


def test_a_watcher_sees_spans_notes_and_totals_in_order():
    with observe.watch() as outer:
        with observe.span("route"):
            observe.note("routing", tokens=3)
        with observe.watch() as inner:
            with observe.span("dispatch", kind="all_to_all"):
                pass
            with observe.span("route"):
                pass
    assert not observe.watching()
    assert [s.name for s in outer.spans] == ["route", "dispatch", "route"]
    assert [s.name for s in inner.spans] == ["dispatch", "route"]
    assert outer.notes("routing") == [{"tokens": 3}] and inner.notes("routing") == []
    assert outer.select(kind="all_to_all")[0].name == "dispatch"
    assert set(outer.totals()) == {"route", "dispatch"}
    assert all(s.seconds >= 0 for s in outer.spans)


def _watch_one_rank_under_the_emulation():
    with emulate.emulated("h100-node") as clock:
        x = torch.ones(1 << 16)
        if dist.get_rank() == 0:                  # only rank 0 watches: nothing to agree on
            with comm.record_comm() as log:
                with comm.collective("all_reduce", x.numel() * 4, 2):
                    work = dist.all_reduce(x, async_op=True)
            seen = log.calls()
        else:
            work, seen = dist.all_reduce(x, async_op=True), 0
        before = clock.now()
        work.wait()
    return seen, before


def test_watching_under_the_emulation_does_not_wait_for_the_collective():
    """A watched collective only reads the emulated clock: the step it watches is the same
    step, and a watch on one rank does not ask the others to agree (it would hang)."""
    (seen, before), (_, other) = lecture_lib.run(_watch_one_rank_under_the_emulation, 2,
                                                 timeout=60)
    assert seen == 1
    assert before == pytest.approx(other)         # rank 0's compute stream did not wait
