"""lecture_lib.runtime.zygote: workers forked from one process that imported torch, behaving as the
fresh interpreters they replace (environment, working directory, library on disk, exit codes,
clean-up), and the fallback to fresh interpreters."""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import lecture_lib
from lecture_lib.grading import procs
from lecture_lib.grading.harness import Exercise
from lecture_lib.grading.sandbox import Limits
from lecture_lib.runtime import launch, zygote

ROOT = Path(__file__).resolve().parent.parent


def _who():
    return os.getpid(), os.getppid(), os.getsid(0), os.getcwd(), os.environ.get("ZYGOTE_PROBE")


def test_workers_are_forks_of_the_zygote_and_see_the_callers_environment(tmp_path, monkeypatch):
    launch.shutdown()
    lecture_lib.run(_who, 1, timeout=60)                 # the zygote starts with this pool
    forks = zygote.get({})
    assert forks is not None and forks.alive()
    monkeypatch.setenv("ZYGOTE_PROBE", "set after the zygote started")
    monkeypatch.chdir(tmp_path)
    launch.shutdown()                                     # a new pool, the zygote is new too
    monkeypatch.setenv("ZYGOTE_PROBE", "seen")
    out = lecture_lib.run(_who, 2, timeout=60)
    forks = zygote.get({})
    for pid, ppid, sid, cwd, probe in out:
        assert ppid == forks.proc.pid                     # forked by the zygote
        assert sid == pid                                 # a session of its own, as before
        assert cwd == str(tmp_path) and probe == "seen"
    launch.shutdown()
    assert not forks.alive()                              # shutdown stops the zygote too


def test_a_failed_call_restarts_the_pool_from_the_same_zygote():
    def fail():
        raise ValueError("planted")
    lecture_lib.run(_who, 2, timeout=60)
    forks = zygote.get({})
    with pytest.raises(lecture_lib.RankError, match="planted"):
        lecture_lib.run(fail, 2, timeout=60)
    out = lecture_lib.run(_who, 2, timeout=60)
    assert zygote.get({}) is forks and {ppid for _, ppid, *_ in out} == {forks.proc.pid}


def test_exit_codes_come_from_the_zygote():
    def die():
        os._exit(7 + int(os.environ["RANK"]))
    with pytest.raises(lecture_lib.RankError, match=r"rank (0|1): .*\(exit code (7|8)\)") as err:
        lecture_lib.run(die, 2, timeout=60)
    assert f"exit code {7 + err.value.rank}" in str(err.value)


def test_a_killed_zygote_is_replaced():
    """Its orphaned workers come back to us when we are a child subreaper (as the grader is):
    ending the pool reaps them rather than waiting forever on zombies."""
    procs.become_subreaper()
    lecture_lib.run(_who, 2, timeout=60)
    old = zygote.get({})
    old.proc.kill()
    old.proc.wait()
    launch.shutdown()                                     # the workers it forked go too
    out = lecture_lib.run(_who, 2, timeout=60)
    new = zygote.get({})
    assert new is not old and {ppid for _, ppid, *_ in out} == {new.proc.pid}


def test_the_zygote_forks_from_one_thread():
    lecture_lib.run(_who, 1, timeout=60)
    pid = zygote.get({}).proc.pid
    assert len(os.listdir(f"/proc/{pid}/task")) == 1


def test_turned_off_the_workers_are_fresh_interpreters():
    code = textwrap.dedent("""
        import os, lecture_lib
        from lecture_lib.runtime import zygote
        out = lecture_lib.run(lambda: os.getppid(), 2, timeout=60)
        assert zygote.get({}) is None and set(out) == {os.getpid()}, out
        print("ok")
    """)
    env = dict(os.environ, LECTURE_LIB_ZYGOTE="0", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_the_zygote_imports_torch_but_not_the_library():
    """So a worker reads lecture_lib's files when it starts: an edited library is picked up by
    the next pool, as with fresh interpreters."""
    code = ("import runpy, sys; runpy.run_path(sys.argv[1], run_name='loaded'); "
            "print(sorted(m for m in sys.modules if m.startswith('lecture_lib')), "
            "'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, str(zygote.SERVER)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.stdout.split() == ["[]", "True"], proc.stderr


def test_the_zygote_leaves_with_its_parent():
    code = textwrap.dedent("""
        import lecture_lib
        from lecture_lib.runtime import zygote
        lecture_lib.run(lambda: 0, 2, timeout=60)
        print(zygote.get({}).proc.pid, *lecture_lib.runtime.worker_pids(), flush=True)
        import os; os._exit(0)                     # no atexit clean-up: the pipes must do it
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 3, proc.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.05)
    assert not any(_running(p) for p in pids)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_the_graders_clean_up_spares_the_zygote(tmp_path):
    """A sandbox's clean-up kills what the submission started, even orphans that came back to
    the grader; the zygote (our child, started while the sandbox was open) and its warm
    workers are not the submission's."""
    launch.shutdown()
    path = tmp_path / "ex04_memory_per_device.py"
    path.write_text("def memory_per_device(*args, **kwargs):\n    return {}\n")
    ex = Exercise("ex04", path, Limits())
    assert ex.memory_per_device(1, 1, 1, 1, 1, 1) == {}     # the sandbox is open
    lecture_lib.run(_who, 2, timeout=60)                   # the zygote starts after it
    forks, workers = zygote.get({}), launch.worker_pids()
    ex._sandbox.close()
    assert forks.alive() and zygote.get({}) is forks and launch.worker_pids() == workers
    assert len(lecture_lib.run(_who, 2, timeout=60)) == 2
