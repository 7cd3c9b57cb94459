"""Run one function on N ranks, from a notebook, a test or a script.

The idea
--------
Distributed training runs one OS process per device ("rank"); the processes
talk through ``torch.distributed``. ``run(fn, world_size)`` starts those
processes, initialises the default process group in each, calls ``fn`` on
every rank and returns the list of return values in rank order::

    import torch, torch.distributed as dist, lecture_lib

    def total(x):
        t = torch.tensor([x * (dist.get_rank() + 1)])
        dist.all_reduce(t)
        return t.item()

    lecture_lib.run(total, 4, 1.0)        # -> [10.0, 10.0, 10.0, 10.0]

How it works (what a notebook needs that ``torch.multiprocessing.spawn``
does not give):

* ``fn`` is serialised *by value* with cloudpickle, so it may be a lambda, a
  closure or a function defined in a notebook cell.
* Worker processes stay alive between calls ("warm pool"): importing torch
  costs seconds, a fresh process group per call costs milliseconds. Each call
  gets its own process group (rendezvous through a TCPStore that the caller
  hosts on a free port), which is destroyed afterwards, so no group, message
  or mesh leaks from one call into the next. The default dtype, grad mode and
  ``torch.distributed``'s functions are restored after each call; other
  global state a function changes (a monkeypatched module, a seed) persists
  in the worker, so a rank function should leave the process as it found it.
* What a rank prints is written to a per-rank log and printed by the caller
  with a ``[rank r]`` prefix (workers' output does not reach a notebook).
* A rank that raises ends the call at once with :class:`RankError` (its
  traceback attached); a rank that is stuck past ``timeout`` ends it with
  :class:`RankTimeout`, which shows every stuck rank's Python stack (dumped
  with :mod:`faulthandler`). In both cases, and on KeyboardInterrupt, every
  worker is killed and the next call starts a fresh pool: a failure never
  poisons the next call, and no process is left behind.

Backends: "auto" picks NCCL with ``cuda:<local rank>`` when the machine has
at least ``world_size`` GPUs, gloo on CPU otherwise. :func:`device` gives a
rank its device. The same rank functions run under ``torchrun``
(env:// rendezvous) through :func:`torchrun_main`.
"""
from __future__ import annotations

import atexit
import datetime
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection, wait

import cloudpickle
import torch
import torch.distributed as dist

DEFAULT_TIMEOUT = 180.0
MAX_IDLE_WORKERS = 12      # warm workers kept across pools before the oldest pool is closed
_START_TIMEOUT = 120.0     # seconds for a cold pool to import torch and say hello


class RankError(RuntimeError):
    """A rank failed: raised, died, or returned something that cannot be sent back."""

    def __init__(self, rank: int, message: str, traceback: str = ""):
        self.rank = rank
        self.traceback = traceback
        text = f"rank {rank}: {message}"
        if traceback:
            text += f"\n\n--- traceback on rank {rank} ---\n{traceback.rstrip()}"
        super().__init__(text)


class RankTimeout(RankError):
    """The call ran past its timeout; ``stacks[rank]`` says where each rank was."""

    def __init__(self, timeout: float, stacks: dict[int, str]):
        self.stacks = stacks
        stuck = sorted(r for r, s in stacks.items() if not s.startswith("finished"))
        parts = [f"--- rank {r} ---\n{s.rstrip()}" for r, s in sorted(stacks.items())]
        message = (f"timed out after {timeout:g} s; ranks still running: {stuck}. "
                   "Where each rank was (most recent call first):\n\n" + "\n\n".join(parts))
        super().__init__(stuck[0] if stuck else 0, message)


# ----------------------------------------------------------------------------
# What a rank function calls
# ----------------------------------------------------------------------------

def device() -> torch.device:
    """This rank's device: ``cuda:<local rank>`` under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return torch.device("cpu")


def choose_backend(world_size: int, backend: str = "auto") -> str:
    """NCCL when there is one GPU per rank, else gloo (the CPU backend)."""
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', not {backend!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise ValueError(f"backend 'nccl' needs one GPU per rank: world_size={world_size}, "
                         f"GPUs found={gpus}")
    return backend


# ----------------------------------------------------------------------------
# The pool of warm workers
# ----------------------------------------------------------------------------

class _Pool:
    """``world_size`` worker processes for one backend, each with a socket to us."""

    def __init__(self, world_size: int, backend: str):
        self.world_size, self.backend = world_size, backend
        self.calls = 0
        self.dir = tempfile.mkdtemp(prefix="lecture_lib_")
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        self.procs, self.conns, self.logs, self.offsets = [], [], [], []
        try:
            for rank in range(world_size):
                self._start(rank)
            self._expect_hello()
        except BaseException:
            self.close()
            raise

    def _start(self, rank: int) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ,
                   OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   LECTURE_LIB_RANK=str(rank), LECTURE_LIB_WORLD_SIZE=str(self.world_size),
                   LECTURE_LIB_FD=str(theirs.fileno()), LECTURE_LIB_BACKEND=self.backend,
                   LECTURE_LIB_STORE=f"127.0.0.1:{self.store.port}",
                   LECTURE_LIB_STACKS=self._path(rank, "stack"),
                   RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(self.world_size))
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        log = open(self._path(rank, "log"), "wb")
        proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "lecture_lib._worker"], env=env,
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            pass_fds=[theirs.fileno()], start_new_session=True)
        theirs.close()
        log.close()
        self.procs.append(proc)
        self.conns.append(Connection(ours.detach()))
        self.logs.append(self._path(rank, "log"))
        self.offsets.append(0)

    def _path(self, rank: int, kind: str) -> str:
        return os.path.join(self.dir, f"rank{rank}.{kind}")

    def _expect_hello(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        pending = dict(enumerate(self.conns))
        while pending:
            ready = wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"ranks {sorted(pending)} did not start within "
                                   f"{_START_TIMEOUT:g} s")
            for rank in [r for r, c in pending.items() if c in ready]:
                try:
                    pending.pop(rank).recv()
                except EOFError:
                    raise RankError(rank, "worker process died while starting:\n"
                                    + self.new_output(rank)) from None

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def new_output(self, rank: int) -> str:
        """What rank printed since we last looked."""
        try:
            with open(self.logs[rank], "rb") as f:
                f.seek(self.offsets[rank])
                data = f.read()
        except OSError:
            return ""
        self.offsets[rank] += len(data)
        return data.decode(errors="replace")

    def close(self) -> None:
        """Kill every worker and wait for it: nothing stays behind."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
        for p in self.procs:
            p.wait()
            if p.stdin:
                p.stdin.close()
        for c in self.conns:
            c.close()
        self.procs, self.conns = [], []
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    # -- one call -------------------------------------------------------------

    def call(self, payload: bytes, timeout: float) -> list:
        self.calls += 1
        message = (self.calls, payload, list(sys.path), os.getcwd(), timeout)
        for conn in self.conns:
            conn.send(message)
        results, pending, returned = {}, dict(enumerate(self.conns)), set()
        deadline = time.monotonic() + timeout
        while pending:
            ready = wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                stacks = self._dump_stacks(set(pending) - returned)
                for rank in returned & set(pending):
                    stacks[rank] = ("finished: fn returned; waiting at the end-of-call barrier "
                                    "for the other ranks")
                raise RankTimeout(timeout, stacks)
            for rank in [r for r, c in pending.items() if c in ready]:
                try:
                    status, value = pending[rank].recv()
                except EOFError:
                    code = self.procs[rank].wait()
                    raise RankError(rank, f"worker process died (exit code {code})") from None
                if status == "returned":
                    returned.add(rank)
                    continue
                del pending[rank]
                if status == "ok":
                    results[rank] = value
                elif status == "unsendable":
                    raise RankError(rank, "returned a value that cannot be sent back to the "
                                          "caller (it must be picklable)", value)
                else:
                    last = value.strip().splitlines()[-1] if value.strip() else "an exception"
                    raise RankError(rank, f"raised {last}", value)
        return [results[r] for r in range(self.world_size)]

    def _dump_stacks(self, stuck: set[int]) -> dict[int, str]:
        for rank in stuck:
            try:
                os.kill(self.procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        stacks = {}
        for rank in range(self.world_size):
            if rank not in stuck:
                stacks[rank] = "finished"
                continue
            path, text = self._path(rank, "stack"), ""
            for _ in range(50):                      # up to 2.5 s for the dump to appear
                time.sleep(0.05)
                if os.path.exists(path) and os.path.getsize(path) > 0:
                    time.sleep(0.05)
                    with open(path, errors="replace") as f:
                        text = f.read()
                    break
            stacks[rank] = _main_thread_stack(text) or "(no stack dumped: process not responding)"
        return stacks


def _main_thread_stack(dump: str) -> str:
    """faulthandler dumps every thread; keep the main thread (the one running fn)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip())
    for block in blocks:
        if "_worker.py" in block and "in _serve" in block:
            lines = [ln for ln in block.splitlines()[1:]
                     if "lecture_lib/_worker.py" not in ln and "<frozen runpy>" not in ln]
            return "\n".join(lines)
    return dump


_POOLS: dict[tuple[int, str], _Pool] = {}
_LOCK = threading.Lock()


def _get_pool(world_size: int, backend: str) -> _Pool:
    key = (world_size, backend)
    pool = _POOLS.pop(key, None)
    if pool is not None and not pool.alive():
        pool.close()
        pool = None
    while _POOLS and sum(k[0] for k in _POOLS) + world_size > MAX_IDLE_WORKERS:
        _POOLS.pop(next(iter(_POOLS))).close()  # the least recently used
    if pool is None:
        pool = _Pool(world_size, backend)
    _POOLS[key] = pool                          # most recently used last
    return pool


def shutdown() -> None:
    """Kill every warm worker (called at exit; call it yourself to free memory)."""
    with _LOCK:
        while _POOLS:
            _POOLS.popitem()[1].close()


atexit.register(shutdown)


def worker_pids(world_size: int | None = None) -> list[int]:
    """Process ids of the warm workers (of pools of ``world_size`` ranks, or all)."""
    return [pid for (size, _), pool in _POOLS.items() if world_size in (None, size)
            for pid in pool.pids()]


# ----------------------------------------------------------------------------
# The entry point
# ----------------------------------------------------------------------------

def run(fn, world_size: int, *args, backend: str = "auto", timeout: float = DEFAULT_TIMEOUT,
        **kwargs) -> list:
    """Call ``fn(*args, **kwargs)`` on ``world_size`` ranks; return the results by rank.

    Inside ``fn`` the default process group is initialised (``dist.get_rank()``
    and every collective work). Tensors in the results come back on the CPU.
    Raises :class:`RankError` when a rank fails and :class:`RankTimeout` after
    ``timeout`` seconds; then every rank has been ended.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, not {world_size!r}")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    backend = choose_backend(world_size, backend)
    try:
        payload = cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:
        raise TypeError(f"cannot send fn and its arguments to the ranks: {exc}") from exc

    with _LOCK:
        pool = _get_pool(world_size, backend)
        failed = True
        try:
            results = pool.call(payload, float(timeout))
            failed = False
        finally:
            _print_output(pool)
            if failed:                       # error, timeout or KeyboardInterrupt
                _POOLS.pop((world_size, backend), None)
                pool.close()
    return [cloudpickle.loads(r) for r in results]


def _print_output(pool: _Pool) -> None:
    for rank in range(pool.world_size):
        text = pool.new_output(rank)
        for line in text.splitlines():
            print(f"[rank {rank}] {line}")


# ----------------------------------------------------------------------------
# The same rank functions under torchrun
# ----------------------------------------------------------------------------

def torchrun_main(fn, *args, **kwargs):
    """Run ``fn`` on this rank under ``torchrun`` (env:// rendezvous) and print its result.

    In a script: ``if __name__ == "__main__": torchrun_main(my_rank_fn, ...)``,
    then ``torchrun --standalone --nproc-per-node=2 script.py``.
    """
    world_size = int(os.environ["WORLD_SIZE"])
    backend = choose_backend(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=DEFAULT_TIMEOUT))
    try:
        result = fn(*args, **kwargs)
        print(f"[rank {dist.get_rank()}] result: {result}", flush=True)
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()
