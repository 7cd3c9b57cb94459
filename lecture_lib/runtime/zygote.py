"""Starting workers in milliseconds: a zygote process that has imported torch forks them.

A cold worker spends seconds importing torch (2-4 s on an idle laptop core,
far more on a busy one), and a pool restarts its workers after every failed
call: a grader running a stub's tests, or a notebook cell that raises, would
pay it again and again. Like Android's zygote and Python's own
``multiprocessing`` forkserver (whose design this follows; it cannot be used
directly, since a worker must get its own session, log file, environment and
the pipe it watches to die with its parent), one process per caller imports
torch once (:mod:`.zygote_server`), and each worker is a ``fork`` of it that
then runs ``lecture_lib.runtime.worker`` exactly as ``python -m`` would. The
messages both sides exchange are :mod:`.protocol`'s.

:meth:`Zygote.spawn` returns a :class:`ForkedWorker`, which answers what
:class:`subprocess.Popen` answers (``pid``, ``poll``, ``wait``, ``kill``,
``returncode``, ``stdin``); the exit codes come from the zygote, the workers'
parent. Set ``LECTURE_LIB_ZYGOTE=0`` to start every worker as a fresh
interpreter instead (:func:`get` then returns None).
"""
from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .protocol import Forked, ForkRequest, WorkerExited, ZygoteReady, pack, unpack

SERVER = Path(__file__).with_name("zygote_server.py")
START_TIMEOUT = 120.0


class ZygoteError(RuntimeError):
    """The zygote could not start, or stopped answering."""


class Zygote:
    """One zygote process, joined to us by a SOCK_SEQPACKET socket."""

    def __init__(self, env: dict):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(env, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   LECTURE_ZYGOTE_FD=str(theirs.fileno()))
        self.proc = subprocess.Popen([sys.executable, "-u", str(SERVER)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, pass_fds=[theirs.fileno()],
                                     start_new_session=True)
        theirs.close()
        self.sock, self.exits, self.lock = ours, {}, threading.Lock()
        try:
            ready = self._receive(START_TIMEOUT)
        except ZygoteError:
            self.close()
            raise
        if not isinstance(ready, ZygoteReady) or ready.threads != 1:   # fork needs one thread
            self.close()
            raise ZygoteError(f"the zygote has {getattr(ready, 'threads', '?')} threads; "
                              "it must have one to fork")

    def _receive(self, timeout: float | None):
        """The next message that is not a :class:`WorkerExited` (those are recorded)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], left)[0]:
                raise ZygoteError(f"the zygote did not answer within {timeout:g} s")
            data = self.sock.recv(4096)
            if not data:
                raise ZygoteError("the zygote has exited")
            message = unpack(data)
            if not isinstance(message, WorkerExited):
                return message
            self.exits[message.pid] = message.returncode

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, env: dict, log_path: str, conn_fd: int) -> ForkedWorker:
        """Fork a worker with ``env`` (its whole environment), output to ``log_path``, and
        ``conn_fd`` (a socket to its pool) as ``LECTURE_LIB_FD``."""
        read_end, write_end = os.pipe()
        try:
            with self.lock:
                request = pack(ForkRequest(env, log_path, os.getcwd()))
                socket.send_fds(self.sock, [request], [conn_fd, read_end])
                forked: Forked = self._receive(START_TIMEOUT)
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        return ForkedWorker(self, forked.pid, os.fdopen(write_end, "wb", buffering=0))

    def exit_code(self, pid: int, block: bool) -> int | None:
        """``pid``'s exit code, waiting for it when ``block``; None while it runs."""
        with self.lock:
            while pid not in self.exits:
                if self.sock.fileno() < 0:         # closed (the zygote died and was replaced)
                    return _gone_code(pid, block)
                wait = None if block else 0.0
                if not select.select([self.sock], [], [], wait)[0]:
                    return None
                data = self.sock.recv(4096)
                if not data:                       # the zygote died: ask the kernel instead
                    return _gone_code(pid, block)
                message = unpack(data)
                if isinstance(message, WorkerExited):
                    self.exits[message.pid] = message.returncode
            return self.exits.pop(pid)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _gone_code(pid: int, block: bool) -> int | None:
    """A worker's exit code without its zygote. Orphaned, it was re-parented to init, or to
    us if we are a child subreaper (the grader is): then we reap it and read its code;
    otherwise the code is lost, and -9 stands for it once the worker has gone."""
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass                                   # not our child
        if not _running(pid):
            return -9
        if not block:
            return None
        time.sleep(0.01)


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


class ForkedWorker:
    """A worker forked by a :class:`Zygote`, with the part of ``Popen``'s interface we use."""

    def __init__(self, zygote: Zygote, pid: int, stdin):
        self.zygote, self.pid, self.stdin, self.returncode = zygote, pid, stdin, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, block=False)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, block=True)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass


_ZYGOTE: list[Zygote] = []
_LOCK = threading.Lock()


def get(env: dict) -> Zygote | None:
    """This process's zygote (started on first use with ``env``), or None when it is turned
    off (``LECTURE_LIB_ZYGOTE=0``) or cannot start: callers then start interpreters."""
    if os.environ.get("LECTURE_LIB_ZYGOTE", "1") == "0":
        return None
    with _LOCK:
        if _ZYGOTE and not _ZYGOTE[0].alive():
            _ZYGOTE.pop().close()
        if not _ZYGOTE:
            try:
                _ZYGOTE.append(Zygote(env))
            except (OSError, ZygoteError):
                return None
        return _ZYGOTE[0]


def pids() -> list[int]:
    """The zygote's process id, if one runs (the grader's clean-up must spare it)."""
    with _LOCK:
        return [z.proc.pid for z in _ZYGOTE if z.alive()]


def shutdown() -> None:
    """Stop the zygote (its workers are the pools' to close)."""
    with _LOCK:
        while _ZYGOTE:
            _ZYGOTE.pop().close()
