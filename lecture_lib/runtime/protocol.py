"""The messages between the caller, its warm workers and the zygote, defined once.

Two channels carry them, each message one :func:`pack`-ed record:

* pool <-> worker (a socket pair per rank, :mod:`.pool` and :mod:`.worker`): a
  worker says :class:`Hello` once it has started; for each call the pool sends
  every rank the same :class:`Job`; the rank answers :class:`Returned` as soon
  as ``fn`` has returned (so a timeout can tell who was still inside it), then
  exactly one of :class:`Result`, :class:`Unsendable` (the result cannot be
  pickled) or :class:`Failure` (``fn`` raised);
* caller <-> zygote (a SOCK_SEQPACKET socket, :mod:`.zygote` and
  :mod:`.zygote_server`): the zygote says :class:`ZygoteReady`; the caller sends
  a :class:`ForkRequest` (two file descriptors attached) and gets
  :class:`Forked`; whenever a forked worker exits the zygote sends
  :class:`WorkerExited`.

A record crosses as a pickled ``(class name, fields)`` of plain values, not as a
pickled instance: the zygote server must not import :mod:`lecture_lib` (its
workers import the library as it is on disk when they start), so it loads this
file by its path, under another name, and a pickled class would not be found by
the same name on both sides. This file therefore imports the standard library only.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, fields

WORKER_MODULE = "lecture_lib.runtime.worker"   # what a worker runs, as ``python -m`` would


# -- pool <-> worker -----------------------------------------------------------

@dataclass(frozen=True)
class Hello:
    """worker -> pool: started, joined the rendezvous store, ready for jobs."""
    rank: int


@dataclass(frozen=True)
class Job:
    """pool -> every worker: call the pickled function once."""
    call_id: int               # numbers the call: a fresh default group's store prefix
    payload: bytes             # cloudpickle of (fn, args, kwargs)
    sys_path: tuple[str, ...]  # the caller's sys.path, appended to the worker's
    cwd: str                   # the caller's working directory
    timeout: float             # the call's timeout (s); the default group waits 60 s longer
    fresh_group: bool          # some rank used point to point last call: new default group


@dataclass(frozen=True)
class Returned:
    """worker -> pool: ``fn`` has returned on this rank (its reply follows)."""
    point_to_point: bool       # this rank sent or received point to point during the call


@dataclass(frozen=True)
class Result:
    """worker -> pool: the call's value, its tensors moved to the CPU."""
    payload: bytes             # cloudpickle of the value


@dataclass(frozen=True)
class Unsendable:
    """worker -> pool: ``fn`` returned a value that cannot be pickled."""
    traceback: str


@dataclass(frozen=True)
class Failure:
    """worker -> pool: ``fn`` (or joining the group) raised."""
    traceback: str


Reply = Result | Unsendable | Failure     # what ends a rank's part of a call


# -- caller <-> zygote ---------------------------------------------------------

@dataclass(frozen=True)
class ZygoteReady:
    """zygote -> caller: torch imported; ``threads`` must be 1 for ``fork`` to be safe."""
    threads: int


@dataclass(frozen=True)
class ForkRequest:
    """caller -> zygote: fork a worker (its pool socket and stdin pipe ride along as fds)."""
    env: dict                  # the worker's whole environment
    log_path: str              # its stdout and stderr
    cwd: str


@dataclass(frozen=True)
class Forked:
    """zygote -> caller: the worker asked for runs as ``pid``."""
    pid: int


@dataclass(frozen=True)
class WorkerExited:
    """zygote -> caller: a forked worker ended (``subprocess``'s convention: minus the
    signal number when killed)."""
    pid: int
    returncode: int


MESSAGES = {cls.__name__: cls for cls in (Hello, Job, Returned, Result, Unsendable, Failure,
                                          ZygoteReady, ForkRequest, Forked, WorkerExited)}


def pack(message) -> bytes:
    """One message as bytes: its class name and its fields, in order."""
    name = type(message).__name__
    if MESSAGES.get(name) is not type(message):
        raise TypeError(f"not a message of the runtime's protocol: {message!r}")
    return pickle.dumps((name, tuple(getattr(message, f.name) for f in fields(message))))


def unpack(data: bytes):
    """The message :func:`pack` made."""
    name, values = pickle.loads(data)
    return MESSAGES[name](*values)
