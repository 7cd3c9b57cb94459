"""One rank of a :mod:`.pool` (started as ``python -m lecture_lib.runtime.worker``).

It imports torch once, then serves jobs (:class:`~.protocol.Job`): for each, it
runs the function in the pool's process group, answers in :mod:`.protocol`'s
messages (:class:`~.protocol.Returned`, then a :class:`~.protocol.Result`,
:class:`~.protocol.Unsendable` or :class:`~.protocol.Failure`), and leaves the
process as the next call expects it. Destroying a gloo group waits tens of
milliseconds (its transport's event loop ticks every 10 ms, and closing each
connection waits for a tick), more than the rest of a warm call, so the default
group is kept from one call to the next unless the call could have left
something in it:

* after a call in which any rank sent or received point to point (a message
  left unreceived would reach the next call) the next call gets a fresh
  default group, as does one that needs a longer timeout than the group has.
  Each rank tells the pool whether it did, and the pool tells every rank at the
  next call: no collective runs after the function, so a rank that finished
  never meets a peer still stuck in the function (a planted hang stays a hang);
* the process groups a call created are destroyed after it;
* the default dtype, grad mode and ``torch.distributed``'s functions are restored.

The worker dies with its parent: a thread watches stdin, which the parent holds open.
"""
import datetime
import faulthandler
import os
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection

import cloudpickle
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from .protocol import Failure, Hello, Job, Result, Returned, Unsendable, pack, unpack

# The kept default group's timeout (s), and whether this call sent or received point to point.
_GROUP = {"timeout": 0.0, "point_to_point": False}


def _die_with_parent() -> None:
    try:
        while os.read(0, 1024):
            pass
    finally:
        os._exit(1)


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value.detach()
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _watch_point_to_point() -> None:
    """Flag every send and receive: ``dist.send``, ``isend``, ``batch_isend_irecv``, ... all
    end in these three methods of the process group (on a subgroup too)."""
    def flagging(original):
        def flagged(self, *args, **kwargs):
            _GROUP["point_to_point"] = True
            return original(self, *args, **kwargs)
        return flagged
    for name in ("send", "recv", "recv_anysource"):
        setattr(dist.ProcessGroup, name, flagging(getattr(dist.ProcessGroup, name)))


def _join_group(store, call_id, rank, world_size, backend, timeout, fresh) -> None:
    """Make sure the default group exists and waits at least ``timeout`` (+60 s) in a collective;
    a new one when ``fresh`` (the pool's word: some rank used point to point last call).

    Every rank decides alike: all have served the same calls with the same timeouts, and the
    pool sends all of them the same ``fresh``.
    """
    needed = timeout + 60
    if dist.is_initialized() and not fresh and _GROUP["timeout"] >= needed:
        return
    _leave_group()
    dist.init_process_group(backend, store=dist.PrefixStore(f"call{call_id}", store),
                            rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=needed))
    _GROUP["timeout"] = needed


def _leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    _GROUP["timeout"] = 0.0


def _end_call() -> None:
    """Destroy the process groups this call created (a local act: no collective, so a rank that
    finished early does not meet a peer still inside the function)."""
    # torch keeps the registry private; destroy_process_group(g) is the public way out
    made = [g for g in distributed_c10d._world.pg_names if g is not dist.group.WORLD]
    for group in reversed(made):
        dist.destroy_process_group(group)


def _call(conn, store, rank, world_size, backend, job: Job):
    for p in job.sys_path:
        if p not in sys.path:
            sys.path.append(p)
    os.chdir(job.cwd)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    # State a call may change and the next call must not inherit: the default dtype, grad
    # mode, and torch.distributed's functions (tests patch them to forbid collectives).
    dtype, grad, dist_attrs = torch.get_default_dtype(), torch.is_grad_enabled(), dict(vars(dist))
    try:
        fn, args, kwargs = cloudpickle.loads(job.payload)
        _join_group(store, job.call_id, rank, world_size, backend, job.timeout, job.fresh_group)
        _GROUP["point_to_point"] = False
        result = fn(*args, **kwargs)
        # so a timeout can tell who was still in fn; and whether the next call needs a new group
        conn.send_bytes(pack(Returned(_GROUP["point_to_point"])))
        vars(dist).update(dist_attrs)      # the clean-up below uses the real functions
        _end_call()
    except BaseException:
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send_bytes(pack(Failure(traceback.format_exc())))
        return
    finally:
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        vars(dist).update(dist_attrs)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        reply = Result(cloudpickle.dumps(_to_cpu(result)))
    except Exception:
        reply = Unsendable(traceback.format_exc())
    conn.send_bytes(pack(reply))


def _serve() -> None:
    rank = int(os.environ["LECTURE_LIB_RANK"])
    world_size = int(os.environ["LECTURE_LIB_WORLD_SIZE"])
    backend = os.environ["LECTURE_LIB_BACKEND"]
    conn = Connection(int(os.environ["LECTURE_LIB_FD"]))
    stacks = open(os.environ["LECTURE_LIB_STACKS"], "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    threading.Thread(target=_die_with_parent, daemon=True).start()
    torch.set_num_threads(1)
    _watch_point_to_point()
    host, port = os.environ["LECTURE_LIB_STORE"].rsplit(":", 1)
    store = dist.TCPStore(host, int(port), None, False,
                          timeout=datetime.timedelta(seconds=60))
    conn.send_bytes(pack(Hello(rank)))
    while True:
        try:
            job = unpack(conn.recv_bytes())
        except EOFError:
            return
        _call(conn, store, rank, world_size, backend, job)


if __name__ == "__main__":
    _serve()
