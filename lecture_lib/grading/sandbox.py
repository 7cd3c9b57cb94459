"""A sandboxed child process per exercise: the only place a submission runs.

The grader's side of the trust boundary. :class:`Sandbox` starts
``python -m lecture_lib.grading._child`` in a session of its own, with
``setrlimit`` limits (address space, CPU seconds, file size, processes) that
its ranks inherit, a copy of the student's file in a private folder, and a
socket. It sends calls as pickles (trusted -> untrusted) and reads replies as
bytes it decodes with :mod:`.safe_load` (data only), within a wall-time
deadline and a size cap; the child's stdout and stderr are drained by a thread
that keeps only the last ``output_kib``. When a call breaks a limit, or the
sandbox closes, every process the submission started is killed
(:func:`.procs.end_all`: its tree, orphans that came back to us as subreaper,
and everything of its user id).

What the child may write is :mod:`.isolation`'s choice: a user id of its own
(root, with an interpreter every user can read: a Gradescope container), its own
namespaces under bubblewrap with the file system read-only but its scratch folder
(any user), or, where neither is possible, the grader's own user (weak: said once,
with the fix).
"""
from __future__ import annotations

import collections
import itertools
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..runtime import worker_pids, zygote
from . import isolation, procs, safe_load
from ._child import HEADER, send_frame

_UID_BASE = 1_500_000_000
_SEQ = itertools.count()
_LIVE: dict[int, "Sandbox"] = {}         # id -> open sandbox
_START_TIMEOUT = 180.0


@dataclass(frozen=True)
class Limits:
    """Per exercise. Defaults measured with margin: the sandboxed child peaks at 0.72 GiB of
    address space, a rank of ex02 or ex07's worked solution at 0.94-1.0 GiB, with 5 threads."""
    memory_gib: float = 4.0       # address space of each process (the child, each rank)
    cpu_s: int = 600              # CPU seconds of each process
    file_mib: int = 64            # the largest file a process may write
    processes: int = 512          # tasks (processes and threads) of the sandbox's user
    wall_s: float = 120.0         # per call, beyond a rank call's own timeout
    output_kib: int = 64          # the tail of stdout/stderr kept
    reply_mib: int = 256          # the largest reply read

    def describe(self, text: str, exercise: str) -> str | None:
        """The limit that ``text`` (an error or a death) shows was broken, as a sentence."""
        checks = [
            (("MemoryError", "can't allocate memory", "Cannot allocate memory", "bad_alloc",
              "out of memory"), f"exceeded {self.memory_gib:g} GiB of memory"),
            (("exit code -24", "SIGXCPU"), f"exceeded {self.cpu_s} s of CPU time"),
            (("exit code -25", "SIGXFSZ", "File too large"),
             f"exceeded the file-size limit of {self.file_mib} MiB"),
            (("Resource temporarily unavailable", "can't start new thread"),
             f"exceeded {self.processes} processes and threads"),
        ]
        for needles, sentence in checks:
            if any(n in text for n in needles):
                return f"{exercise}: {sentence}"
        return None

    def rlimits(self) -> dict[str, int]:
        return {"RLIMIT_AS": int(self.memory_gib * 2**30), "RLIMIT_CPU": int(self.cpu_s),
                "RLIMIT_FSIZE": int(self.file_mib * 2**20)}


class LimitExceeded(AssertionError):
    """The submission broke a resource limit (its first line says which)."""


class SandboxDied(AssertionError):
    """The submission's process ended or broke the protocol."""


class _Tail:
    """The last ``cap`` bytes of a pipe, drained by a thread so the child never blocks."""

    def __init__(self, pipe, cap: int):
        self.chunks, self.size, self.total, self.cap = collections.deque(), 0, 0, cap
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self.thread.start()

    def _drain(self, pipe) -> None:
        while chunk := pipe.read1(1 << 16):
            with self.lock:
                self.chunks.append(chunk)
                self.size += len(chunk)
                self.total += len(chunk)
                while self.size - len(self.chunks[0]) >= self.cap:
                    self.size -= len(self.chunks.popleft())

    def since(self, mark: int) -> str:
        """Output written after ``mark`` (a past ``total``), its last ``cap`` bytes at most."""
        with self.lock:
            data = b"".join(self.chunks)[-(self.total - mark):] if self.total > mark else b""
            lost = (self.total - mark) - len(data)
        text = data[-self.cap:].decode(errors="replace")
        return (f"[... {lost + max(0, len(data) - self.cap)} bytes of output cut ...]\n"
                if lost > 0 or len(data) > self.cap else "") + text


class Sandbox:
    """One child process for one exercise, restarted after a call breaks it."""

    def __init__(self, exercise: str, source: Path, limits: Limits):
        self.exercise, self.source, self.limits = exercise, Path(source), limits
        self.proc = self.sock = self.tail = self.dir = self.uid = None
        self.started = 0
        self.key = next(_SEQ)
        self.python = os.environ.get("LECTURE_SANDBOX_PYTHON", sys.executable)
        self.isolation = isolation.choose(self.python)

    # -- starting ---------------------------------------------------------------

    def _start(self) -> None:
        procs.become_subreaper()
        self.dir = Path(tempfile.mkdtemp(prefix=f"sandbox_{self.exercise}_"))
        (self.dir / "submission").mkdir()
        copy = self.dir / "submission" / self.source.name
        copy.write_bytes(self.source.read_bytes())        # the grader reads it; never runs it
        user, command = {}, [self.python, "-m", "lecture_lib.grading._child"]
        if self.isolation == isolation.SEPARATE_USER:
            self.uid = _UID_BASE + (os.getpid() % 4_000_000) * 16 + self.key % 16
            for p in (self.dir, self.dir / "submission", copy):
                os.chown(p, self.uid, self.uid)
            user = dict(user=self.uid, group=self.uid, extra_groups=[])
        elif self.isolation == isolation.NAMESPACE:
            command = [isolation.bubblewrap(), *isolation.bwrap_args(self.dir), "--", *command]
        ours, theirs = socket.socketpair()
        env = self._environment(copy, theirs.fileno())
        self.proc = subprocess.Popen(
            command, cwd=self.dir, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            pass_fds=[theirs.fileno()], start_new_session=True, **user)
        theirs.close()
        self.sock, self.started = ours, procs.start_time(self.proc.pid)
        self.tail = _Tail(self.proc.stdout, self.limits.output_kib * 1024)
        _LIVE[self.key] = self
        self._reply(time.monotonic() + _START_TIMEOUT, f"the start-up time of {_START_TIMEOUT:g} s")

    def _environment(self, copy: Path, fd: int) -> dict:
        limits = self.limits.rlimits()
        if self.uid is not None:                      # a user id of its own: count from 0
            limits["RLIMIT_NPROC"] = self.limits.processes
        elif os.geteuid() != 0:                       # RLIMIT_NPROC counts all of our user's
            limits["RLIMIT_NPROC"] = procs.count_tasks(os.getuid()) + self.limits.processes
        path = [p for p in sys.path if p]
        return dict(os.environ, LECTURE_SANDBOX_EXERCISE=self.exercise,
                    LECTURE_SANDBOX_FILE=str(copy), LECTURE_SANDBOX_FD=str(fd),
                    LECTURE_SANDBOX_LIMITS=_json(limits), PYTHONPATH=os.pathsep.join(path),
                    PYTHONDONTWRITEBYTECODE="1", HOME=str(self.dir), TMPDIR=str(self.dir),
                    USER="sandbox", LOGNAME="sandbox", OMP_NUM_THREADS="1",
                    CUDA_VISIBLE_DEVICES="")    # gloo on CPU: CUDA maps more than RLIMIT_AS allows

    # -- one call ---------------------------------------------------------------

    def call(self, payload: bytes, wall: float):
        """Send a pickled ``(fn, args, kwargs)``; return the decoded value or raise."""
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self._start()
        mark = self.tail.total
        try:
            send_frame(self.sock, payload)
        except OSError:
            pass                                          # it died: _reply says how
        try:
            reply = self._reply(time.monotonic() + wall, f"the wall-time limit of {wall:g} s")
        finally:
            self._show_output(mark)
        return reply

    def _reply(self, deadline: float, what: str):
        try:
            data = self._read(deadline)
        except TimeoutError:
            self.close()
            raise LimitExceeded(f"{self.exercise}: exceeded {what}") from None
        except (EOFError, OSError) as exc:
            raise self._death(str(exc)) from None
        reply = safe_load.decode(data)
        if type(reply) is not dict or "ok" not in reply:
            raise safe_load.ForbiddenValue("the submission's process sent a reply of the wrong "
                                           "shape")
        return reply

    def _read(self, deadline: float) -> bytes:
        head = self._exactly(HEADER.size, deadline)
        size = HEADER.unpack(head)[0]
        if size > self.limits.reply_mib * 2**20:
            self.close()
            raise safe_load.ForbiddenValue(f"{self.exercise}: a reply of {size} bytes is over "
                                           f"the {self.limits.reply_mib} MiB limit")
        return self._exactly(size, deadline)

    def _exactly(self, n: int, deadline: float) -> bytes:
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise TimeoutError
            chunk = self.sock.recv(min(n - got, 1 << 20))
            if not chunk:
                raise EOFError("the channel closed")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _death(self, why: str) -> AssertionError:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        output = self.tail.since(0)[-2000:]
        self.close()
        if code is not None and code > 128 and self.isolation == isolation.NAMESPACE:
            code = 128 - code               # bubblewrap exits 128 + N when its child dies of N
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else -code
            why = f"killed by {name}"
        text = f"{why}\n{output}"
        limit = self.limits.describe(text, self.exercise)
        if limit:
            return LimitExceeded(limit)
        last = output.strip().splitlines()[-1] if output.strip() else ""
        return SandboxDied(f"{self.exercise}: the submission's process ended ({why}, exit code "
                           f"{code}); its last output: {last[:300]}")

    def _show_output(self, mark: int) -> None:
        text = self.tail.since(mark) if self.tail else ""
        if text:
            print(text[-16000:], end="" if text.endswith("\n") else "\n")

    # -- ending -----------------------------------------------------------------

    def close(self) -> None:
        """Kill the child and everything the submission started; remove its folder."""
        _LIVE.pop(self.key, None)
        if self.proc is not None:
            keep = ({s.proc.pid for s in _LIVE.values() if s.proc} | set(worker_pids())
                    | set(zygote.pids()))          # our warm workers and the zygote forking them
            procs.end_all([self.proc.pid], self.uid, keep, since=self.started)
            self.proc.wait()
            self.proc.stdout.close()
            self.sock.close()
            self.tail.thread.join(timeout=5)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.proc = self.sock = self.dir = None


def _json(limits: dict) -> str:
    return "{" + ", ".join(f'"{k}": {int(v)}' for k, v in limits.items()) + "}"


def close_all() -> None:
    """Close every open sandbox (after each test module, and at exit)."""
    for box in list(_LIVE.values()):
        box.close()
