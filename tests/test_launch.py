"""lecture_lib.run: results, output, errors, hangs, interrupts, parallel launches,
bad input, torchrun, and that no process is ever left behind."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib.runtime import launch

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _wait_dead(pids, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


# -- success ------------------------------------------------------------------

def test_results_in_rank_order_with_args_and_kwargs():
    def fn(base, scale=1):
        t = torch.tensor([float(dist.get_rank() + base)])
        dist.all_reduce(t)
        return dist.get_rank(), dist.get_world_size(), t.item() * scale
    out = lecture_lib.run(fn, 4, 1, scale=2, timeout=60)
    assert out == [(r, 4, 2 * (0 + 1 + 2 + 3 + 4)) for r in range(4)]


def test_lambdas_closures_and_tensors_come_back():
    offset = torch.arange(3.0)
    out = lecture_lib.run(lambda: offset * (dist.get_rank() + 1), 2, timeout=60)
    torch.testing.assert_close(out[1], offset * 2)
    assert lecture_lib.run(lambda: None, 1) == [None]


def test_rank_device_threads_and_backend():
    out = lecture_lib.run(lambda: (str(lecture_lib.device()), torch.get_num_threads(),
                                   dist.get_backend()), 2, timeout=60)
    assert out == [("cpu", 1, "gloo")] * 2


def test_each_call_gets_a_fresh_process_group():
    def make_group():
        g = dist.new_group([0, 1])
        t = torch.ones(1)
        dist.all_reduce(t, group=g)
        return t.item()
    for _ in range(3):                  # groups do not pile up or clash across calls
        assert lecture_lib.run(make_group, 2, timeout=60) == [2.0, 2.0]


def test_state_a_call_changes_does_not_leak_into_the_next():
    def change():
        dist.all_reduce = None                      # a test forbidding collectives, say
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)

    def look():
        return callable(dist.all_reduce), torch.get_default_dtype(), torch.is_grad_enabled()
    lecture_lib.run(change, 2, timeout=60)
    assert lecture_lib.run(look, 2, timeout=60) == [(True, torch.float32, True)] * 2


def _send_and_leave_it():
    if dist.get_rank() == 0:
        dist.isend(torch.tensor([42.0]), 1)         # never received in this call


def _receive_what_is_there():
    if dist.get_rank() == 1:
        t = torch.zeros(1)
        request = dist.irecv(t, 0)
        time.sleep(0.3)
        return request.is_completed(), t.item()
    return None


def test_a_message_left_unreceived_does_not_reach_the_next_call():
    lecture_lib.run(_send_and_leave_it, 2, timeout=60)
    assert lecture_lib.run(_receive_what_is_there, 2, timeout=60)[1] == (False, 0.0)
    assert lecture_lib.run(lambda: dist.get_rank(), 2, timeout=60) == [0, 1]


def test_printed_output_comes_back_prefixed(capsys):
    def talk():
        print(f"hello from {dist.get_rank()}")
        print("to stderr", file=sys.stderr)
    lecture_lib.run(talk, 2, timeout=60)
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out
    assert "[rank 1] to stderr" in out


def test_warm_calls_are_much_cheaper_than_a_cold_start():
    launch.shutdown()
    t0 = time.perf_counter()
    lecture_lib.run(lambda: 0, 3, timeout=60)
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(5):
        t0 = time.perf_counter()
        lecture_lib.run(lambda: 0, 3, timeout=60)
        warm.append(time.perf_counter() - t0)
    assert sorted(warm)[2] < cold / 2, (cold, warm)


# -- failures -----------------------------------------------------------------

def _raise_on_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("boom on purpose")
    t = torch.zeros(1)
    dist.recv(t, 1)             # would wait forever for rank 1


def test_a_raising_rank_is_named_with_its_traceback_and_others_are_ended():
    lecture_lib.run(lambda: 0, 3, timeout=60)
    pids = launch.worker_pids(3)
    t0 = time.perf_counter()
    with pytest.raises(lecture_lib.RankError) as info:
        lecture_lib.run(_raise_on_rank_one, 3, timeout=60)
    assert time.perf_counter() - t0 < 20
    err = info.value
    assert isinstance(err, RuntimeError) and not isinstance(err, lecture_lib.RankTimeout)
    assert err.rank == 1 and "ValueError: boom on purpose" in str(err)
    assert "_raise_on_rank_one" in err.traceback
    assert _wait_dead(pids) == []
    assert lecture_lib.run(lambda: dist.get_rank(), 3, timeout=60) == [0, 1, 2]


def _stuck_on_rank_zero():
    if dist.get_rank() == 0:
        t = torch.zeros(1)
        dist.recv(t, 1)         # rank 1 never sends
    return dist.get_rank()


def test_a_hang_times_out_with_every_stuck_rank_stack():
    lecture_lib.run(lambda: 0, 2, timeout=60)
    pids = launch.worker_pids(2)
    t0 = time.perf_counter()
    with pytest.raises(lecture_lib.RankTimeout) as info:
        lecture_lib.run(_stuck_on_rank_zero, 2, timeout=3)
    assert time.perf_counter() - t0 < 15
    err = info.value
    assert isinstance(err, lecture_lib.RankError)
    assert "_stuck_on_rank_zero" in err.stacks[0] and "recv" in err.stacks[0]
    assert err.stacks[1].startswith("finished")
    assert "rank 0" in str(err) and "_stuck_on_rank_zero" in str(err)
    assert _wait_dead(pids) == []
    assert lecture_lib.run(lambda: dist.get_rank(), 2, timeout=60) == [0, 1]


def test_a_dying_rank_is_reported():
    def die():
        if dist.get_rank() == 1:
            os._exit(7)
        dist.barrier()
    with pytest.raises(lecture_lib.RankError, match=r"rank 1: worker process died \(exit code 7\)"):
        lecture_lib.run(die, 2, timeout=60)
    assert lecture_lib.run(lambda: 1, 2, timeout=60) == [1, 1]


def test_keyboard_interrupt_ends_all_ranks():
    lecture_lib.run(lambda: 0, 2, timeout=60)
    pids = launch.worker_pids(2)
    main = threading.main_thread().ident
    # Ctrl-C as a terminal delivers it: Python's own handler, the signal not blocked (a test
    # run earlier in the same pytest worker may have left another handler or a mask behind)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    timer = threading.Timer(1.0, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            lecture_lib.run(lambda: time.sleep(60), 2, timeout=120)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert _wait_dead(pids) == [] and launch.worker_pids(2) == []
    assert lecture_lib.run(lambda: 2, 2, timeout=60) == [2, 2]


def test_unsendable_return_value_is_a_clear_error():
    with pytest.raises(lecture_lib.RankError, match="cannot be sent back"):
        lecture_lib.run(lambda: threading.Lock(), 2, timeout=60)


# -- bad input: clear errors before any process starts ---------------------------

@pytest.mark.parametrize("world_size", [0, -1, 1.5, "2", True])
def test_bad_world_size(world_size):
    with pytest.raises(ValueError, match="world_size"):
        lecture_lib.run(lambda: 0, world_size)


def test_bad_backend_timeout_and_fn():
    with pytest.raises(ValueError, match="backend"):
        lecture_lib.run(lambda: 0, 2, backend="mpi")
    with pytest.raises(ValueError, match="GPU"):
        lecture_lib.run(lambda: 0, 64, backend="nccl")
    with pytest.raises(ValueError, match="timeout"):
        lecture_lib.run(lambda: 0, 2, timeout=0)
    with pytest.raises(TypeError, match="callable"):
        lecture_lib.run(42, 2)
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot send"):
        lecture_lib.run(lambda: lock, 2)


# -- processes outside this one -----------------------------------------------

SCRIPT = textwrap.dedent("""\
    import os, sys, time, torch, torch.distributed as dist
    import lecture_lib
    from lecture_lib.runtime import launch
    mode = sys.argv[1]
    out = lecture_lib.run(lambda: dist.get_rank(), 2, timeout=60)
    assert out == [0, 1], out
    print("PIDS", *launch.worker_pids(), flush=True)
    if mode == "sleep":
        lecture_lib.run(lambda: time.sleep(600), 2, timeout=900)
    for _ in range(20):
        t = lecture_lib.run(lambda: (torch.ones(1) * dist.get_rank()).sum().item(), 2)
    print("DONE", flush=True)
    """)


def _script(tmp_path, mode):
    path = tmp_path / "launch_script.py"
    path.write_text(SCRIPT)
    return subprocess.Popen([sys.executable, str(path), mode], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)


def _pids(proc):
    # readline buffers ahead: read the rest through proc.stdout too, never communicate()
    for line in iter(proc.stdout.readline, ""):
        if line.startswith("PIDS"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError("script printed no PIDS line")


def test_parallel_launches_do_not_collide_and_leave_nothing(tmp_path):
    procs = [_script(tmp_path, "quick") for _ in range(3)]
    try:
        pids = [_pids(p) for p in procs]
        for p in procs:
            p.wait(timeout=120)                    # a few lines of output: the pipe cannot fill
            rest = p.stdout.read()
            assert p.returncode == 0 and "DONE" in rest, rest
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert _wait_dead([x for ps in pids for x in ps]) == []


def test_workers_die_with_a_killed_parent(tmp_path):
    proc = _script(tmp_path, "sleep")
    pids = _pids(proc)
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    assert _wait_dead(pids) == []


def test_same_rank_function_runs_under_torchrun():
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node=2",
                          str(ROOT / "examples" / "allreduce_torchrun.py")],
                         capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[rank 0] result: 3.0" in out.stdout and "[rank 1] result: 3.0" in out.stdout


def _fails_to_connect_once(marker):
    # the first call fails as gloo does when a peer closes its end while the ranks connect
    if not os.path.exists(marker):
        if dist.get_rank() == 0:
            Path(marker).write_text("x")
        raise RuntimeError("Gloo connectFullMesh failed with [pair.cc] Connection closed by peer")
    return dist.get_rank()


def _counts_and_fails(counter):
    if dist.get_rank() == 0:
        with open(counter, "a") as f:
            f.write("x")
    raise RuntimeError("some other failure")


def test_a_call_whose_ranks_fail_to_connect_runs_once_more(tmp_path):
    marker = str(tmp_path / "tried")
    assert lecture_lib.run(_fails_to_connect_once, 2, marker, timeout=60) == [0, 1]
    counter = tmp_path / "calls"
    with pytest.raises(lecture_lib.RankError, match="some other failure"):
        lecture_lib.run(_counts_and_fails, 2, str(counter), timeout=60)
    assert counter.read_text() == "x"              # any other failure: no second call
