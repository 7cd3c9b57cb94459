"""The warm pool behind :func:`lecture_lib.run`: worker processes and one call to them.

A :class:`WorkerPool` starts ``world_size`` processes (``python -m
lecture_lib.runtime.worker``, forked by :mod:`.zygote` after one import of
torch, or fresh interpreters where it is off), each joined to the caller by a
socket pair, and hosts the TCPStore through which they rendezvous. :meth:`WorkerPool.call`
sends every rank the same :class:`~.protocol.Job` and collects the replies
(:mod:`.protocol`): a result, a traceback (:class:`RankError`), a death, or nothing before the
deadline (:class:`RankTimeout`, with each stuck rank's Python stack, dumped
by :mod:`faulthandler` on SIGUSR1). Closing a pool kills every worker's
whole session (SIGKILL to its process group) and waits for it, so nothing
stays behind. :mod:`.launch` keeps the pools and decides when.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait

import torch.distributed as dist

from . import zygote
from .protocol import WORKER_MODULE, Job, Reply, Result, Returned, Unsendable, pack, unpack

START_TIMEOUT = 120.0      # seconds for a cold pool to import torch and say hello
PER_RANK = ("LECTURE_LIB_", "RANK", "LOCAL_RANK", "WORLD_SIZE")   # not the zygote's business
WORKER_FILE = os.path.join(*WORKER_MODULE.split(".")) + ".py"   # its frames, in a stack dump


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


class WorkerPool:
    """``world_size`` worker processes for one backend, each with a socket to us."""

    def __init__(self, world_size: int, backend: str):
        self.world_size, self.backend = world_size, backend
        self.calls = 0
        self.fresh_group = False       # some rank used point to point in the last call
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
        forks = zygote.get({k: v for k, v in env.items() if not k.startswith(PER_RANK)})
        if forks is not None:
            try:
                proc = forks.spawn(env, self._path(rank, "log"), theirs.fileno())
            except (OSError, zygote.ZygoteError):
                forks, proc = None, None
        if forks is None:
            with open(self._path(rank, "log"), "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-u", "-m", WORKER_MODULE], env=env,
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=[theirs.fileno()], start_new_session=True)
        theirs.close()
        self.procs.append(proc)
        self.conns.append(Connection(ours.detach()))
        self.logs.append(self._path(rank, "log"))
        self.offsets.append(0)

    def _path(self, rank: int, kind: str) -> str:
        return os.path.join(self.dir, f"rank{rank}.{kind}")

    def _expect_hello(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        pending = dict(enumerate(self.conns))
        while pending:
            ready = wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"ranks {sorted(pending)} did not start within "
                                   f"{START_TIMEOUT:g} s")
            for rank in [r for r, c in pending.items() if c in ready]:
                try:
                    unpack(pending.pop(rank).recv_bytes())        # Hello
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
        job = pack(Job(self.calls, payload, tuple(sys.path), os.getcwd(), timeout,
                       self.fresh_group))
        self.fresh_group = False
        for conn in self.conns:
            conn.send_bytes(job)
        results, pending, returned = {}, dict(enumerate(self.conns)), set()
        deadline = time.monotonic() + timeout
        while pending:
            ready = wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                stacks = self._dump_stacks(set(pending) - returned)
                for rank in returned & set(pending):
                    stacks[rank] = "finished: fn returned; the other ranks had not"
                raise RankTimeout(timeout, stacks)
            for rank in [r for r, c in pending.items() if c in ready]:
                try:
                    reply = unpack(pending[rank].recv_bytes())
                except EOFError:
                    code = self.procs[rank].wait()
                    raise RankError(rank, f"worker process died (exit code {code})") from None
                if isinstance(reply, Returned):
                    returned.add(rank)
                    self.fresh_group = self.fresh_group or reply.point_to_point
                    continue
                del pending[rank]
                results[rank] = self._result(rank, reply)
        return [results[r] for r in range(self.world_size)]

    def _result(self, rank: int, reply: Reply) -> bytes:
        """A rank's pickled value, or the :class:`RankError` its reply stands for."""
        if isinstance(reply, Result):
            return reply.payload
        if isinstance(reply, Unsendable):
            raise RankError(rank, "returned a value that cannot be sent back to the "
                                  "caller (it must be picklable)", reply.traceback)
        dead = self._dead_rank()                 # a peer's death makes the others raise
        if dead is not None:
            raise RankError(dead[0], f"worker process died (exit code {dead[1]})")
        text = reply.traceback.strip()
        last = text.splitlines()[-1] if text else "an exception"
        raise RankError(rank, f"raised {last}", reply.traceback)

    def _dead_rank(self, grace: float = 0.25) -> tuple[int, int] | None:
        """``(rank, exit code)`` of a worker that has exited (within ``grace`` seconds), or None.

        A rank whose peer died raises "connection closed by peer", sometimes before the
        caller has seen the death: the death is the cause to report.
        """
        deadline = time.monotonic() + grace
        while True:
            for rank, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    return rank, proc.returncode
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

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
        if WORKER_FILE in block and "in _serve" in block:
            lines = [ln for ln in block.splitlines()[1:]
                     if WORKER_FILE not in ln and "<frozen runpy>" not in ln]
            return "\n".join(lines)
    return dump
