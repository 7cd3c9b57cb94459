"""Run one function on N ranks, from a notebook, a test or a script.

Distributed training runs one OS process per device (a "rank"); the processes talk
through ``torch.distributed``. ``run(fn, world_size)`` calls ``fn`` on every rank, inside
an initialised default process group, and returns the results in rank order::

    def total(x):
        t = torch.tensor([x * (dist.get_rank() + 1)])
        dist.all_reduce(t)
        return t.item()

    lecture_lib.run(total, 4, 1.0)        # -> [10.0, 10.0, 10.0, 10.0]

What a notebook needs that ``torch.multiprocessing.spawn`` does not give:

* ``fn`` travels *by value* (cloudpickle): a lambda, a closure, a notebook cell's function;
* the workers stay alive between calls with their default group (:mod:`.pool`: importing
  torch and tearing gloo down cost seconds); each call starts from the same state: the
  groups a call made are destroyed after it (the default one too after point-to-point
  messages, where one could be left unreceived), and the default dtype, grad mode and
  ``torch.distributed``'s functions are restored;
* what a rank prints comes back prefixed ``[rank r]``;
* a rank that raises ends the call at once (:class:`RankError`, its traceback attached),
  a stuck one after ``timeout`` (:class:`RankTimeout`, every stuck rank's stack); then
  every worker is killed and the next call starts a fresh pool: no process is left behind.

Backends: NCCL with ``cuda:<local rank>`` when there is a GPU per rank, gloo on the CPU
otherwise (:func:`choose_backend`, :func:`device`). The same rank functions run under
``torchrun`` through :func:`torchrun_main`.
"""
from __future__ import annotations

import atexit
import datetime
import os
import sys
import threading

import cloudpickle
import torch
import torch.distributed as dist

from . import zygote
from .pool import RankError, RankTimeout, WorkerPool

__all__ = ["run", "device", "choose_backend", "shutdown", "worker_pids", "torchrun_main",
           "RankError", "RankTimeout", "DEFAULT_TIMEOUT", "MAX_IDLE_WORKERS"]

DEFAULT_TIMEOUT = 180.0
MAX_IDLE_WORKERS = 12      # warm workers kept across pools before the oldest pool is closed


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

    for attempt in range(2):
        try:
            return _call(payload, world_size, backend, float(timeout))
        except RankError as exc:
            if attempt or _TRANSIENT not in str(exc):
                raise
            print(f"[lecture_lib] gloo could not connect the ranks ({_TRANSIENT}); running "
                  "the call once more on fresh ranks", file=sys.stderr, flush=True)


# Gloo pairs the ranks over TCP when a group is made; on a loaded machine a peer can close its
# end while the ranks start (seen in CI at a DeviceMesh's first subgroup). Nothing ran yet that
# the call's result depends on, so run() runs the call once more on a fresh pool.
_TRANSIENT = "Gloo connectFullMesh failed"


def _call(payload: bytes, world_size: int, backend: str, timeout: float) -> list:
    """One call of the pool of ``world_size`` ranks; a failed call ends the pool."""
    with _LOCK:
        pool = _get_pool(world_size, backend)
        failed = True
        try:
            results = pool.call(payload, timeout)
            failed = False
        finally:
            _print_output(pool)
            if failed:                       # error, timeout or KeyboardInterrupt: a fresh pool
                _POOLS.pop((world_size, backend), None)
                pool.close()
    return [cloudpickle.loads(r) for r in results]


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
# The warm pools, one per (world size, backend)
# ----------------------------------------------------------------------------

_POOLS: dict[tuple[int, str], WorkerPool] = {}
_LOCK = threading.Lock()


def _get_pool(world_size: int, backend: str) -> WorkerPool:
    key = (world_size, backend)
    pool = _POOLS.pop(key, None)
    if pool is not None and not pool.alive():
        pool.close()
        pool = None
    while _POOLS and sum(k[0] for k in _POOLS) + world_size > MAX_IDLE_WORKERS:
        _POOLS.pop(next(iter(_POOLS))).close()  # the least recently used
    if pool is None:
        pool = WorkerPool(world_size, backend)
    _POOLS[key] = pool                          # most recently used last
    return pool


def _print_output(pool: WorkerPool) -> None:
    for rank in range(pool.world_size):
        text = pool.new_output(rank)
        for line in text.splitlines():
            print(f"[rank {rank}] {line}")


def shutdown() -> None:
    """Kill every warm worker and stop the zygote that forks them (called at exit; call it
    yourself to free memory)."""
    with _LOCK:
        while _POOLS:
            _POOLS.popitem()[1].close()
        zygote.shutdown()


atexit.register(shutdown)


def worker_pids(world_size: int | None = None) -> list[int]:
    """Process ids of the warm workers (of pools of ``world_size`` ranks, or all)."""
    return [pid for (size, _), pool in _POOLS.items() if world_size in (None, size)
            for pid in pool.pids()]


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
