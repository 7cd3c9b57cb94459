"""One rank of a :mod:`lecture_lib.launch` pool (started as ``python -m lecture_lib._worker``).

It imports torch once, then serves calls: for each, it joins a fresh process
group, runs the function, sends back ``("ok", result)`` or
``("error", traceback)``, and leaves the group. It dies with its parent: a
thread watches stdin, which the parent holds open.
"""
import datetime
import faulthandler
import os
import signal
import sys
import threading
import traceback

import cloudpickle
import torch
import torch.distributed as dist
from multiprocessing.connection import Connection


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


def _call(conn, store, rank, world_size, backend, message):
    call_id, payload, path, cwd, timeout = message
    for p in path:
        if p not in sys.path:
            sys.path.append(p)
    os.chdir(cwd)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    # State a call may change and the next call must not inherit: the default dtype, grad
    # mode, and torch.distributed's functions (tests patch them to forbid collectives).
    dtype, grad, dist_attrs = torch.get_default_dtype(), torch.is_grad_enabled(), dict(vars(dist))
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        dist.init_process_group(backend, store=dist.PrefixStore(f"call{call_id}", store),
                                rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout + 60))
        result = fn(*args, **kwargs)
        conn.send(("returned", None))      # so a timeout can tell who was still in fn
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(("error", traceback.format_exc()))
        return
    finally:
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        vars(dist).update(dist_attrs)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        reply = ("ok", cloudpickle.dumps(_to_cpu(result)))
    except Exception:
        reply = ("unsendable", traceback.format_exc())
    conn.send(reply)


def _serve() -> None:
    rank = int(os.environ["LECTURE_LIB_RANK"])
    world_size = int(os.environ["LECTURE_LIB_WORLD_SIZE"])
    backend = os.environ["LECTURE_LIB_BACKEND"]
    conn = Connection(int(os.environ["LECTURE_LIB_FD"]))
    stacks = open(os.environ["LECTURE_LIB_STACKS"], "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    threading.Thread(target=_die_with_parent, daemon=True).start()
    torch.set_num_threads(1)
    host, port = os.environ["LECTURE_LIB_STORE"].rsplit(":", 1)
    store = dist.TCPStore(host, int(port), None, False,
                          timeout=datetime.timedelta(seconds=60))
    conn.send(("hello", rank))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        _call(conn, store, rank, world_size, backend, message)


if __name__ == "__main__":
    _serve()
