"""The zygote behind :mod:`.zygote`: import torch once, then fork each worker.

Started by :class:`.zygote.Zygote` as a script (``python -u <this
file>``), so that lecture_lib itself is not imported here: each worker
imports the library as it is on disk when the worker starts, exactly as
``python -m lecture_lib.runtime.worker`` does, and only torch's import (seconds,
most of a cold start) is shared, with ``torch._dynamo``'s, which the first
optimizer a worker builds would import. The process has one thread when it forks
(``OMP_NUM_THREADS=1`` keeps numpy's BLAS from starting any), which is what
makes ``fork`` without ``exec`` safe.

It serves one SOCK_SEQPACKET socket (fd ``LECTURE_ZYGOTE_FD``) with the
messages of ``protocol.py`` beside it (loaded by its path, under a name outside
the library, and dropped again in each worker): a :class:`ForkRequest` with
two file descriptors attached (the worker's socket to its pool, and the read
end of the pipe it watches to die with its parent) is answered by
:class:`Forked`; when a worker exits it sends :class:`WorkerExited`. It exits
when its stdin or its socket closes.
"""
import importlib.util
import os
import runpy
import select
import signal
import socket
import sys
import traceback

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]           # run as a script: its folder (runtime/) is no top-level package

PROTOCOL = "zygote_protocol"  # protocol.py, standard library only; not lecture_lib.runtime.protocol
_spec = importlib.util.spec_from_file_location(
    PROTOCOL, os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))
protocol = importlib.util.module_from_spec(_spec)
sys.modules[PROTOCOL] = protocol          # dataclasses look their module up while being made
_spec.loader.exec_module(protocol)

# What every worker imports, loaded once here. torch._dynamo: torch.optim's first optimizer
# imports it (the decorator that keeps dynamo off its methods), seconds of CPU in every worker.
import cloudpickle  # noqa: E402, F401
import torch  # noqa: E402, F401
import torch._dynamo  # noqa: E402, F401
import torch.distributed  # noqa: E402, F401

MAX_REQUEST = 1 << 20


def _child(sock: socket.socket, wake: tuple[int, int], request: bytes, fds: list[int]) -> None:
    """In the forked process: become a worker as ``python -m lecture_lib.runtime.worker``
    would."""
    code = 1
    try:
        sock.close()
        for fd in wake:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fork = protocol.unpack(request)                # a ForkRequest
        env, log_path, cwd = fork.env, fork.log_path, fork.cwd
        del sys.modules[PROTOCOL]                     # the worker imports the library afresh
        conn_fd, stdin_fd = fds
        os.setsid()
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.clear()
        os.environ.update(env, LECTURE_LIB_FD=str(conn_fd))
        os.chdir(cwd)
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [cwd] + [p for p in extra if p not in sys.path]
        sys.argv = ["-m"]
        runpy.run_module(protocol.WORKER_MODULE, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(protocol.pack(protocol.WorkerExited(pid, os.waitstatus_to_exitcode(status))))


def main() -> None:
    sock = socket.socket(fileno=int(os.environ.pop("LECTURE_ZYGOTE_FD")))
    wake = os.pipe()
    for fd in wake:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)      # wakes select through the pipe
    sock.send(protocol.pack(protocol.ZygoteReady(len(os.listdir("/proc/self/task")))))
    while True:
        ready, _, _ = select.select([sock, 0, wake[0]], [], [])
        if 0 in ready and not os.read(0, 1024):
            return                                       # the parent has gone
        if wake[0] in ready:
            while True:
                try:
                    if not os.read(wake[0], 1024):
                        break
                except BlockingIOError:
                    break
        _reap(sock)
        if sock in ready:
            request, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 2)
            if not request:
                return
            pid = os.fork()
            if pid == 0:
                _child(sock, wake, request, fds)
            for fd in fds:
                os.close(fd)
            sock.send(protocol.pack(protocol.Forked(pid)))


if __name__ == "__main__":
    main()
