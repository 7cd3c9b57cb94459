"""lecture_lib.profiling: trace arithmetic on hand-made events, then a real 2-rank profile."""
import json
import os

import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import profiling
from lecture_lib.metrics import Timer
from lecture_lib.models import (
    GPT,
    GPTConfig,
    MarkovText,
    TrainResult,
    assert_same_training,
    shard,
    train_reference,
)
from lecture_lib.profiling import Event

# -- trace arithmetic (no ranks) ----------------------------------------------

def test_classify_names_comm_compute_and_steps():
    assert profiling.classify("ProfilerStep#3", "user_annotation") == "step"
    assert profiling.classify("gloo:all_reduce", "user_annotation") == "comm"
    assert profiling.classify("c10d::allreduce_", "cpu_op") == "comm"
    assert profiling.classify("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel") == "comm"
    assert profiling.classify("aten::mm", "cpu_op") == "compute"
    assert profiling.classify("ampere_sgemm_128x64_nn", "kernel") == "compute"
    assert profiling.classify("DistributedDataParallel.forward", "user_annotation") is None


def test_merge_and_covered_count_overlaps_once():
    assert profiling.merge([(0, 2), (1, 3), (5, 6)]) == [(0, 3), (5, 6)]
    assert profiling.merge([(0, 1), (1.05, 2)], gap=0.1) == [(0, 2)]
    assert profiling.covered([(0, 2), (1, 3), (5, 6)], [(0, 4)]) == pytest.approx(3)
    assert profiling.covered([(0, 2), (3, 10)], [(1, 4), (5, 6)]) == pytest.approx(3)


def _events(*rows, device=False):
    return [Event(n, k, s, e, "1", device) for n, k, s, e in rows]


def test_shares_join_the_handover_to_gloos_execution():
    steps = [(0.0, 10.0)]
    events = _events(("aten::mm", "compute", 0, 4),
                     ("c10d::allreduce_", "comm", 4, 4.1),        # handed over at 4
                     ("gloo:all_reduce", "comm", 5, 8))           # gloo ran 5..8
    comm, busy = profiling.shares(events, steps)
    assert comm == pytest.approx(0.4)          # 4..8 in flight
    assert busy == pytest.approx(0.4)          # computing 0..4
    profile = profiling.RankProfile(0, steps, events, comm, busy, "")
    assert profiling.overlap_share(profile) == pytest.approx(0.0)   # comm starts at 4, after it
    # unpaired (counts differ): each event counts on its own
    comm, _ = profiling.shares(events[:2] + events[2:] * 2, steps)
    assert comm == pytest.approx(0.31)


def test_shares_use_the_device_timeline_when_there_are_kernels():
    events = _events(("aten::mm", "compute", 0, 9)) + _events(
        ("sgemm", "compute", 1, 3), ("ncclDevKernel_AllReduce", "comm", 3, 4), device=True)
    assert profiling.shares(events, [(0.0, 10.0)]) == (pytest.approx(0.1), pytest.approx(0.2))


def test_step_comm_shares_split_the_timers_phase():
    steps = [(0.0, 10.0), (10.0, 20.0)]
    events = _events(("aten::mm", "compute", 0, 4),
                     ("phase:comm", "phase", 4, 9),
                     ("aten::cat", "compute", 4, 5),              # flatten, inside the phase
                     ("c10d::allreduce_", "comm", 5, 5.1),
                     ("gloo:all_reduce", "comm", 5.5, 8),         # in flight 5..8
                     ("aten::mm", "compute", 10, 13))             # step 2: no phase annotated
    profile = profiling.RankProfile(0, steps, events, 0.0, 0.0, "",
                                    timer_spans=[("comm", 4.0, 8.5), ("comm", 13, 14)])
    first, second = profile.step_comm_shares()
    assert first.comm == pytest.approx(0.3) and first.timed == pytest.approx(0.45)
    assert (first.phase, first.comm_in_phase, first.compute_in_phase) == (
        pytest.approx(0.5), pytest.approx(0.3), pytest.approx(0.1))
    assert first.rest_in_phase == pytest.approx(0.1)
    assert second == (0.0, pytest.approx(0.1), None, None, None) and second.rest_in_phase is None
    # a phase entered a different number of times per step: no per-step timer share
    uneven = profiling.RankProfile(0, steps, events, 0.0, 0.0, "", timer_spans=[("comm", 4, 8)])
    assert [s.timed for s in uneven.step_comm_shares()] == [None, None]
    assert profiling.classify("phase:comm", "user_annotation") == "phase"


def test_read_trace_needs_profiler_steps(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": 5, "tid": 1}]}))
    with pytest.raises(ValueError, match="ProfilerStep"):
        profiling.read_trace(path)


def test_diagnose_applies_the_rules_of_thumb():
    d = profiling.diagnose(0.45, 0.9)
    assert d.comm_bound and not d.underused and "bucket" in str(d)
    d = profiling.diagnose(0.1, 0.5)
    assert d.underused and not d.comm_bound and "batch" in str(d)
    d = profiling.diagnose(0.1, 0.95)
    assert not (d.comm_bound or d.underused) and "no rule" in str(d)
    assert profiling.diagnose(0.30, 0.70).findings == profiling.diagnose(0.1, 0.9).findings[:0] + \
        profiling.diagnose(0.30, 0.70).findings      # the limits themselves do not fire
    assert not profiling.diagnose(0.30, 0.70).comm_bound
    with pytest.raises(ValueError, match="comm_share"):
        profiling.diagnose(1.5, 0.9)


def test_diagnose_does_not_advise_what_the_run_already_does():
    """A DDP run that already buckets and overlaps its all-reduces is told to give each more
    work, not to bucket and overlap; the facts it was given are in its findings."""
    plain = profiling.diagnose(0.68, 0.32, comm_kinds={"all_reduce"})
    assert "bucket" in str(plain) and "overlap" in str(plain)
    done = profiling.diagnose(0.68, 0.32, comm_kinds={"all_reduce"}, overlapped=True)
    assert done.comm_bound and done.underused
    assert "bucket gradients" not in str(done) and "already" in str(done)
    assert "more work" in str(done) and "faster link" in str(done)
    assert done.findings[1] == plain.findings[1]          # the busy rule's advice is unchanged
    quiet = profiling.diagnose(0.1, 0.9, comm_kinds={"all_reduce"}, overlapped=True)
    assert quiet.findings == profiling.diagnose(0.1, 0.9).findings
    pipe = profiling.diagnose(0.45, 0.5, comm_kinds={"send", "recv"}, overlapped=True)
    assert pipe.findings == profiling.diagnose(0.45, 0.5, comm_kinds={"send", "recv"}).findings
    with pytest.raises(ValueError, match="overlapped"):
        profiling.diagnose(0.45, 0.5, comm_kinds={"all_reduce"}, overlapped="yes")


def test_diagnose_traces_idle_time_to_exposed_communication_first():
    """When exposed communication is most of the time the device idles, the busy rule points
    at it, not at the batch size or host overhead; otherwise its advice is unchanged."""
    d = profiling.diagnose(0.70, 0.30, comm_kinds={"all_reduce"}, overlapped=True)
    assert d.comm_bound and d.underused
    assert "exposed communication above" in d.findings[1] and "host overhead" not in d.findings[1]
    most = profiling.diagnose(0.35, 0.40, comm_kinds={"all_reduce"})     # idle 60%, 35% exposed
    assert "exposed communication above" in most.findings[1]
    some = profiling.diagnose(0.31, 0.20, comm_kinds={"all_reduce"})     # idle 80%, 31% exposed
    assert some.comm_bound and "host overhead" in some.findings[1]
    assert "batch" in str(profiling.diagnose(0.2, 0.5))                   # not communication-bound


def test_diagnose_advises_what_the_run_communicated():
    """A pipeline (sends and receives) is never told to bucket gradients; DP is."""
    pipe = profiling.diagnose(0.45, 0.5, comm_kinds={"send", "recv"})
    assert pipe.comm_bound and pipe.underused
    assert "bucket" not in str(pipe) and "micro-batches" in str(pipe)
    ddp = profiling.diagnose(0.45, 0.5, comm_kinds={"all_reduce", "broadcast"})
    assert "bucket" in str(ddp) and "bubble" not in str(ddp)
    fsdp = profiling.diagnose(0.45, 0.9, comm_kinds={"all_gather", "reduce_scatter"})
    assert "bucket" not in str(fsdp) and "prefetch" in str(fsdp)
    assert profiling.comm_kinds(_events(("c10d::allreduce_", "comm", 0, 1),
                                        ("gloo:send", "comm", 1, 2),
                                        ("c10d::recv_", "comm", 2, 3),
                                        ("aten::mm", "compute", 0, 1))) == {
        "all_reduce", "send", "recv"}


def test_bad_schedule_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="active"):
        profiling.profile_run(lambda timer: None, 2, active=0)
    with pytest.raises(ValueError, match="wait"):
        profiling.profile_run(lambda timer: None, 2, wait=-1)
    with pytest.raises(TypeError, match="make_step"):
        profiling.profile_run("not a function", 2)


def test_bad_emulated_profiles_are_refused_before_any_process_starts(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(lecture_lib.runtime.launch, "run", no_launch)
    with pytest.raises(ValueError, match="unknown emulation preset"):
        profiling.profile_run(profiling.data_parallel_step, 2, emulate="tpu-pod")
    with pytest.raises(ValueError, match="trace"):
        profiling.profile_run(profiling.data_parallel_step, 2, emulate="h100-node",
                              trace_dir="traces")


# -- a real profile on two ranks ------------------------------------------------

def _make_step(timer, batch, communicate):
    rank, size = dist.get_rank(), dist.get_world_size()
    model = GPT(GPTConfig(d_model=32, n_layers=2, seq_len=16, n_heads=2)).to(lecture_lib.device())
    data = MarkovText(64, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(i):
        x, y = (t.to(lecture_lib.device()) for t in shard(data.batch(i, batch), rank, size))
        with timer("compute"):
            model(x, y).backward()
        if communicate:                        # one flat message; the timer holds only it
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            with timer("comm"):
                dist.all_reduce(flat)
            torch.nn.utils.vector_to_parameters(flat / size, [p.grad for p in model.parameters()])
        else:
            with timer("comm"):
                pass
        with timer("optimizer"):
            opt.step()
            opt.zero_grad()
    return step


def test_profile_of_a_data_parallel_step(tmp_path):
    profiles = profiling.profile_run(_make_step, 2, 8, True, active=5,
                                     trace_dir=str(tmp_path), timeout=120)
    for rank, p in enumerate(profiles):
        assert p.rank == rank and len(p.steps) == 5
        assert os.path.exists(tmp_path / f"rank{rank}.json") and p.trace_path
        assert 0.0 < p.comm_share < 1.0 and 0.0 < p.busy_share < 1.0
        assert "Self CPU time total" in p.table and "aten::" in p.table
        # the timer's phases are in the trace: the step's all-reduce lies inside its
        # "comm" phase on the typical step (gloo's thread, preempted between waking the
        # training thread and recording its end, can push one step's end past the phase)
        per_step = p.step_comm_shares()
        assert len(per_step) == 5 and all(s.timed is not None and s.phase for s in per_step)
        assert all(s.timed < s.phase + 0.01 for s in per_step), per_step
        outside = sorted(s.comm - s.comm_in_phase for s in per_step)
        assert outside[2] < 0.005, per_step
        kinds = {k for k, _, _ in profiling.timeline(p)}
        assert kinds == {"compute", "comm"}
        assert "all_reduce" in p.comm_kinds and not {"send", "recv"} & p.comm_kinds
    # without communication (same pool, warm) the trace shows none
    quiet = profiling.profile_run(_make_step, 2, 8, False, active=2, timeout=120)
    assert all(p.comm_share == 0.0 and p.trace_path is None for p in quiet)


# -- the workloads the notebook profiles train like one process ------------------

TINY = GPTConfig(d_model=32, n_layers=2, seq_len=16, n_heads=2)


def _two_steps_each():
    out = {}
    for sync in ("ddp", "flat", "per_param", "bucketed", "individual"):
        step = profiling.data_parallel_step(Timer(), batch_size=8, sync=sync, cfg=TINY,
                                            bucket_cap_mb=0.01)
        step(0)
        step(1)
        out[sync] = {n: p.detach().clone() for n, p in step.model.named_parameters()}
    pipe = profiling.pipeline_step(Timer(), batch_size=8, microbatches=2, cfg=TINY)
    pipe(0)
    pipe(1)
    held = {id(p) for p in pipe.params}
    out["pipeline"] = {n: p.detach().clone() for n, p in pipe.model.named_parameters()
                       if id(p) in held}
    return out


def test_profiled_workloads_train_like_one_process():
    """Two SGD steps of each workload equal one process on the whole batch (rtol 1e-5)."""
    data = MarkovText(TINY.vocab_size, TINY.seq_len)
    ref = train_reference(GPT(TINY), lambda s: data.batch(s, 8), 2, lr=0.1, optimizer="sgd")
    ranks = lecture_lib.run(_two_steps_each, 2, timeout=120)
    for got in ranks:
        for sync in ("ddp", "flat", "per_param", "bucketed", "individual"):
            assert_same_training(TrainResult(ref.losses, got[sync]), ref, rtol=1e-5, atol=1e-6)
    stages = {**ranks[0]["pipeline"], **ranks[1]["pipeline"]}
    assert set(stages) == set(ref.params)                     # the two stages hold everything once
    assert_same_training(TrainResult(ref.losses, stages), ref, rtol=1e-5, atol=1e-6)


def test_profile_of_the_pipeline_executor_names_its_sends_not_all_reduce():
    profiles = profiling.profile_run(profiling.pipeline_step, 2, batch_size=8, microbatches=2,
                                     cfg=TINY, active=2, timeout=120)
    for p in profiles:
        assert {"send", "recv"} & p.comm_kinds and "all_reduce" not in p.comm_kinds
        assert 0.0 < p.busy_share < 1.0
    assert "bucket" not in str(profiling.diagnose_run(profiles, comm_limit=0.0))


def test_workloads_refuse_bad_arguments():
    with pytest.raises(lecture_lib.RankError, match="sync must be"):
        lecture_lib.run(lambda: profiling.data_parallel_step(None, sync="zero"), 2, timeout=60)


# -- the same profile in emulated time --------------------------------------------

def _emulated_profiles():
    # A step that communication bounds, so the rules of thumb have something to read: under the
    # calibrated charges a small model's step is its kernel launches (5 us of host time each)
    # and a d_model 64 model's all-reduce on NVLink is 1% of it. Here 25 MB of gradients
    # (d_model 512, 6.3M parameters) cross InfiniBand HDR (one A100 per node), on 4 sequences
    # of 32 tokens per rank (cheap on the CPU), in buckets of 1 MB.
    cfg = GPTConfig(d_model=512, n_layers=2, seq_len=32, n_heads=4)
    out = {}
    for sync in ("flat", "bucketed"):
        timer = Timer()
        step = profiling.data_parallel_step(timer, 8, sync, cfg, bucket_cap_mb=1.0)
        first, again = (profiling.profile_steps_emulated(step, "a100-ib", wait=0, warmup=1,
                                                         active=2, timer=timer)
                        for _ in range(2))
        out[sync] = (first, again)
    return out


def test_an_emulated_profile_reads_like_a_gpu_trace():
    """In emulated time bucketed DDP's all-reduces run while backward computes, flat DDP's
    only after it; the profile is deterministic, and the rules of thumb read it."""
    runs = lecture_lib.run(_emulated_profiles, 2, timeout=180)
    for rank, by_sync in enumerate(runs):
        for sync, (first, again) in by_sync.items():
            assert first.rank == rank and first.trace_path is None
            assert all(e.device for e in first.events) and first.comm_kinds == {"all_reduce"}
            assert first.steps == again.steps and first.comm_share == again.comm_share
            assert 0 < first.comm_share <= 1 and 0 < first.busy_share < 1
            assert "comm: all_reduce" in first.table
            compute = sum(e.end - e.start for e in first.events if e.kind == "compute")
            assert first.busy_share == pytest.approx(compute / sum(b - a for a, b in first.steps))
            assert 0 <= first.launch_share < 1 - first.busy_share      # waits are not busy
            assert set(first.timer_totals) == {"forward", "backward", "optimizer",
                                               "comm" if sync == "flat" else "wait"}
        assert profiling.overlap_share(by_sync["flat"][0]) == 0
        assert profiling.overlap_share(by_sync["bucketed"][0]) > 0
    diagnosis = profiling.diagnose_run([by_sync["flat"][0] for by_sync in runs])
    assert "all-reduce" in str(diagnosis)
    # the communication rule reads the exposed share: what the devices wait for
    bucketed = [by_sync["bucketed"][0] for by_sync in runs]
    expected = sum(profiling.exposed_share(p) for p in bucketed) / len(bucketed)
    assert profiling.diagnose_run(bucketed).comm_share == pytest.approx(expected)
    assert expected < sum(p.comm_share for p in bucketed) / len(bucketed)   # less than in flight


def test_a_stream_waiting_for_launches_is_not_busy():
    """Kernels shorter than their launches: the clock's compute span holds the waits (the step's
    length), ``launch_waits`` lists them, and the emulated trace cuts them out of the busy time,
    as a GPU trace shows gaps between kernels."""
    from lecture_lib.emulate.clock import Clock  # noqa: PLC0415
    from lecture_lib.profiling.emulated import kernels_only  # noqa: PLC0415
    clock = Clock()
    clock.launch(1.0, 5.0)             # launched at 5, runs 5..6
    clock.launch(1.0, 3.0)             # launched at 8, runs 8..9
    clock.launch(4.0, 1.0)             # launched at 9, runs 9..13: no wait
    assert clock.launches == 3 and clock.launch_waits == [(0.0, 5.0), (6.0, 8.0)]
    assert clock.spans == [("compute", 0.0, 13.0, "")] and clock.compute == 13.0
    assert kernels_only(0.0, 13.0, clock.launch_waits) == [(5.0, 6.0), (8.0, 13.0)]
    assert kernels_only(7.0, 12.0, clock.launch_waits) == [(8.0, 12.0)]
    assert kernels_only(0.0, 4.0, clock.launch_waits) == []
    assert kernels_only(0.0, 3.0, []) == [(0.0, 3.0)]


def test_exposed_is_a_wait_for_communication_not_for_a_launch():
    """In flight 1..5; a kernel runs 0..2; the stream waits for a launch 2..3: the device waits
    for the collective only 3..5 (0.4 of the step), though no kernel runs 2..5."""
    steps = [(0.0, 5.0)]
    events = _events(("mm", "compute", 0, 2), ("all_reduce", "comm", 1, 5), device=True)
    comm, busy = profiling.shares(events, steps)
    profile = profiling.RankProfile(0, steps, events, comm, busy, "", launch_gaps=[(2.0, 3.0)])
    assert (comm, busy) == (pytest.approx(0.8), pytest.approx(0.4))
    assert profiling.overlap_share(profile) == pytest.approx(0.2)          # under the kernel
    assert profiling.exposed_share(profile) == pytest.approx(0.4)          # not the launch gap
    no_gaps = profiling.RankProfile(0, steps, events, comm, busy, "")
    assert profiling.exposed_share(no_gaps) == pytest.approx(0.6)          # a GPU trace alone


