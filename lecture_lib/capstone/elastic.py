"""Failures and restarts: the simulated crash, a process group per restart, a watchdog.

The idea
--------
``torchrun --max-restarts=N`` restarts every worker when one dies, and the new workers
rendezvous again. By default torchrun's agent shares its rendezvous TCPStore with the
workers (``TORCHELASTIC_USE_AGENT_STORE=True``), and ``init_process_group("env://")`` writes
and reads the group's keys (each gloo rank's address, the join barrier's counter) under the
same names in every generation. A restarted worker can then read the dead worker's address
before its successor overwrites it, and fail (``Gloo connectFullMesh failed ... Connection
refused``) or wait forever (PyTorch issue 135712, github.com/pytorch/pytorch/issues/135712;
torch's switch ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` gives each restart a fresh store).
:func:`join_group` needs no switch: it builds the store from ``MASTER_ADDR``/``MASTER_PORT``
itself and puts every key of the process group under ``capstone/restart<n>/``, where ``n`` is
``TORCHELASTIC_RESTART_COUNT``, so generation 1 never reads a key of generation 0.

And no rank waits without a word (DESIGN principle 8, "fail loudly, never hang"): a
:class:`Watchdog` thread knows what its rank is doing (joining the group, step ``k``, a
checkpoint, the final barrier) and, when that has taken longer than ``timeout`` seconds,
prints what the rank waited for, the likely cause and the fix, with every thread's stack,
and ends the process (exit code :data:`EXIT_TIMEOUT`; torchrun then restarts or reports it).
The group's own timeout (store, gloo connect, collectives) is ``timeout`` + :data:`GRACE`,
a bounded backstop behind the watchdog. Under ``lecture_lib.run`` the launcher's timeout does
the same job (:class:`lecture_lib.RankTimeout` with every stuck rank's stack), so there
:func:`watch` does nothing.
"""
from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..runtime import choose_backend

__all__ = ["DEFAULT_TIMEOUT", "EXIT_TIMEOUT", "GRACE", "Watchdog", "check_failure",
           "join_group", "maybe_fail", "restart_generation", "torchrun_main", "watch"]

DEFAULT_TIMEOUT = 180.0   # seconds one phase (the join, a step, a checkpoint) may take
GRACE = 30.0              # the group's timeout is this much longer: the watchdog speaks first
EXIT_TIMEOUT = 124        # the exit code of a rank the watchdog ended (as timeout(1)'s)

STEP_FIX = ("a collective of this phase waits for every rank: look above for a rank that "
            "failed or is stuck; if one phase legitimately takes longer on this machine, "
            "raise --timeout")


def check_failure(fail_at, fail_rank: int, world: int | None, checkpoint_dir,
                  checkpoint_every: int, steps: int) -> None:
    """A simulated crash must be resumable: a checkpoint folder and a checkpoint before it
    (``world`` None: the rank is checked later, when the world size is known)."""
    if fail_at is None:
        return
    if not checkpoint_dir:
        raise ValueError("fail_at needs a checkpoint_dir (to resume, and to fail only once)")
    if not checkpoint_every or checkpoint_every < 1:
        raise ValueError(f"fail_at={fail_at} needs checkpoint_every >= 1 (--checkpoint-every): "
                         "without a checkpoint the restart silently trains again from step 0")
    if not checkpoint_every <= fail_at < steps:
        raise ValueError(f"fail_at must be in [checkpoint_every, steps) = [{checkpoint_every}, "
                         f"{steps}), not {fail_at}: the failure must come after the first "
                         "checkpoint (else the restart starts from step 0) and before the end")
    if world is not None and not 0 <= fail_rank < world:
        raise ValueError(f"fail_rank must be in [0, {world}), not {fail_rank}")


def maybe_fail(fail_at, fail_rank: int, checkpoint_dir, step: int) -> None:
    """SIGKILL this rank at step ``fail_at``, once (the marker survives the restart)."""
    if fail_at != step or dist.get_rank() != fail_rank:
        return
    marker = Path(checkpoint_dir) / f"failed_step{step}_rank{fail_rank}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    with open(marker, "w") as f:
        f.write("killed here\n")
        f.flush()
        os.fsync(f.fileno())
    print(f"rank {fail_rank}: SIGKILL at step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------------------
# The watchdog
# ----------------------------------------------------------------------------

_ACTIVE: list[Watchdog] = []        # the running watchdog of this process, if any


def watch(what: str, fix: str = STEP_FIX) -> None:
    """Tell this process's watchdog what the rank does now (nothing when none runs)."""
    if _ACTIVE:
        _ACTIVE[0].enter(what, fix)


class Watchdog:
    """End this process, saying why, when one phase runs past ``timeout`` seconds."""

    def __init__(self, timeout: float, rank: int, poll: float = 0.5):
        if not timeout or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.timeout, self.rank, self.poll = float(timeout), rank, poll
        self.phase = ("starting", STEP_FIX, time.monotonic())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capstone-watchdog", daemon=True)

    def enter(self, what: str, fix: str = STEP_FIX) -> None:
        self.phase = (what, fix, time.monotonic())
        # the backstop if this thread cannot run (the GIL held in C++): stacks, then _exit(1)
        faulthandler.dump_traceback_later(self.timeout + GRACE / 2, exit=True)

    def __enter__(self) -> Watchdog:
        _ACTIVE[:] = [self]
        self.enter(*self.phase[:2])
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        faulthandler.cancel_dump_traceback_later()
        _ACTIVE.clear()

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            what, fix, since = self.phase
            if time.monotonic() - since > self.timeout:
                self._expire(what, fix)

    def _expire(self, what: str, fix: str) -> None:
        gen = restart_generation()
        sys.stderr.write(
            f"\nrank {self.rank} (restart {gen}): waited more than {self.timeout:g} s "
            f"(--timeout) for {what}; giving up.\nFix: {fix}.\nEvery thread's stack:\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(EXIT_TIMEOUT)


# ----------------------------------------------------------------------------
# The process group under torchrun
# ----------------------------------------------------------------------------

def restart_generation() -> int:
    """How many times torchrun has restarted this worker group (0 on the first run)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def join_group(timeout: float = DEFAULT_TIMEOUT) -> str:
    """Join torchrun's job as the default group, keyed by restart generation; the backend."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    prefix = f"capstone/restart{restart_generation()}"
    backend = choose_backend(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    limit = datetime.timedelta(seconds=timeout + GRACE)
    fix = (f"start every rank (the same --nproc-per-node / --nnodes on each node) and check "
           f"that {where} is reachable")
    if restart_generation() > 0:
        fix += ("; this is a restart: if a dead worker's address still answers from the store "
                "(PyTorch issue 135712), set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    watch(f"the process group: all {world} ranks joining through the store at {where} "
          f"(keys under {prefix}/)", fix)
    try:
        store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=limit))
        store.set_timeout(limit)
        dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=rank,
                                world_size=world, timeout=limit)
    except Exception as exc:
        raise RuntimeError(f"rank {rank} could not join the {backend} process group of "
                           f"restart {restart_generation()} through the store at {where} "
                           f"(keys under {prefix}/): {exc}") from exc
    return backend


def torchrun_main(fn, *args, timeout: float = DEFAULT_TIMEOUT, **kwargs):
    """Run ``fn`` on this rank under torchrun, watched; print and return its result."""
    rank = int(os.environ["RANK"])
    with Watchdog(timeout, rank):
        join_group(timeout)
        try:
            watch("setting up: the model, the latest checkpoint, the device's matmul rate")
            result = fn(*args, **kwargs)
            print(f"[rank {rank}] result: {result}", flush=True)
            watch("the final barrier (every rank finishing its last step)")
            dist.barrier()
            return result
        finally:
            watch("destroying the process group")
            dist.destroy_process_group()
