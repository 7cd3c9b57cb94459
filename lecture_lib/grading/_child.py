"""The sandboxed child (``python -m lecture_lib.grading._child``): where a submission runs.

Started by :class:`lecture_lib.grading.sandbox.Sandbox`, under the resource
limits it passes, in a session of its own (and, where the grader runs as root,
under a user id of its own). It serves calls from the grader over a socket:
each request is a pickled ``(fn, args, kwargs)`` written by the grader (trusted
in this direction); each reply is :mod:`.safe_load` data, ``{"ok": True,
"value": ...}`` or ``{"ok": False, "error": {...}}``. The submission is loaded
here (and on the ranks this process starts), never in the grader.
"""
import json
import os
import resource
import socket
import struct
import sys
import traceback

import cloudpickle

from . import safe_load

HEADER = struct.Struct(">Q")


def apply_limits(limits: dict) -> None:
    """``{"RLIMIT_AS": n, ...}``: soft = hard = n, except CPU: n seconds beyond what starting
    this process took (importing torch), SIGXCPU at the soft limit, SIGKILL 5 s later."""
    for name, value in limits.items():
        if name == "RLIMIT_CPU":
            used = resource.getrusage(resource.RUSAGE_SELF)
            value += int(used.ru_utime + used.ru_stime) + 1
        hard = value + 5 if name == "RLIMIT_CPU" else value
        resource.setrlimit(getattr(resource, name), (value, hard))


def send_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(HEADER.pack(len(data)) + data)


def recv_frame(sock: socket.socket) -> bytes | None:
    """One frame, or None when the grader closed the channel."""
    head = _recv_exactly(sock, HEADER.size)
    if head is None:
        return None
    return _recv_exactly(sock, HEADER.unpack(head)[0])


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _answer(request: bytes) -> dict:
    try:
        fn, args, kwargs = cloudpickle.loads(request)
        value = fn(*args, **kwargs)
        return {"ok": True, "value": safe_load.to_data(value)}
    except BaseException as exc:             # a submission may raise anything, SystemExit too
        return {"ok": False, "error": safe_load.error_data(exc, traceback.format_exc())}


def main() -> None:
    apply_limits(json.loads(os.environ.pop("LECTURE_SANDBOX_LIMITS")))
    sock = socket.socket(fileno=int(os.environ.pop("LECTURE_SANDBOX_FD")))
    send_frame(sock, safe_load.encode({"ok": True, "value": "hello"}))
    while (request := recv_frame(sock)) is not None:
        reply = _answer(request)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            data = safe_load.encode(reply)   # looked up each time: a submission may replace it
        except Exception as exc:
            data = safe_load.encode({"ok": False, "error": safe_load.error_data(
                exc, traceback.format_exc())})
        send_frame(sock, data)


if __name__ == "__main__":
    main()
