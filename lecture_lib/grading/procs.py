"""Keeping track of every process a submission starts, and ending all of them.

A process can leave its process group and session (``setsid``) and its parent
(a double fork), so neither ``killpg`` nor a walk down the process tree finds
everything it started. Two mechanisms do:

* the trusted process that starts sandboxes marks itself a *child subreaper*
  (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux 3.4): an orphan below it is
  re-parented to it instead of to init, so it stays a descendant we can find;
* when the sandbox runs under a user id of its own (see :mod:`.sandbox`), every
  process of that user id is the submission's, whatever its ancestry.

:func:`end_all` kills both sets and repeats until a scan finds nothing (a
process that forks while we kill is caught by the next scan).
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans below this process come back to it (Linux); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _table() -> dict[int, tuple[int, int, bool, int]]:
    """pid -> (parent pid, real uid, is a zombie, start time in clock ticks) of every process
    (from /proc; where there is none, as on macOS, from ``ps``, without start times)."""
    if not os.path.isdir("/proc"):
        return _table_from_ps()
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/status") as f:
                uid = next(line for line in f if line.startswith("Uid:")).split()[1]
            out[int(name)] = (int(stat[1]), int(uid), stat[0] in "ZX", int(stat[19]))
        except (OSError, StopIteration, ValueError, IndexError):
            continue                    # it ended while we looked
    return out


def _table_from_ps() -> dict[int, tuple[int, int, bool, int]]:
    done = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,ruid=,stat="], capture_output=True,
                          text=True, timeout=30)
    out = {}
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0].isdigit():
            out[int(fields[0])] = (int(fields[1]), int(fields[2]), fields[3].startswith("Z"), 0)
    return out


def start_time(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def descendants(pid: int, table: dict | None = None) -> set[int]:
    """Every process below ``pid`` in the process tree."""
    table = _table() if table is None else table
    children: dict[int, list[int]] = {}
    for p, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(p)
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _targets(roots: list[int], uid: int | None, keep: set[int],
             since: int) -> tuple[set[int], dict]:
    table = _table()
    me = os.getpid()
    found = {r for r in roots if r in table}
    for r in roots:
        found |= descendants(r, table)
    if uid is not None and uid != os.getuid():
        found |= {p for p, (_, u, *_) in table.items() if u == uid}
    # orphans re-parented to us (we are a subreaper), started after the sandbox was, that we
    # did not start knowingly
    found |= {p for p, (ppid, _, _, t) in table.items()
              if ppid == me and p not in keep and t >= since}
    protected = set(keep)
    for k in keep:
        protected |= descendants(k, table)
    return found - protected - {me}, table


def end_all(roots: list[int], uid: int | None = None, keep: set[int] = frozenset(),
            since: int = 0, rounds: int = 100) -> None:
    """SIGKILL ``roots``, their descendants, our unexpected orphans and ``uid``'s processes.

    ``roots`` are children we started with :class:`subprocess.Popen` (which reaps them);
    ``keep``: pids (with their descendants) that are ours and must live (other sandboxes,
    our own warm rank workers); ``since``: when the first root started (an orphan that is
    older cannot be the submission's).
    """
    me = os.getpid()
    for _ in range(rounds):
        targets, table = _targets(roots, uid, set(keep), since)
        alive = {p for p in targets if not table[p][2]}
        # zombies we must collect: our own orphans (a Popen reaps the roots itself)
        ours = {p for p in targets if table[p][0] == me and p not in roots}
        if not alive and not ours:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in ours:                # orphans that came back to us: collect them
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        time.sleep(0.01)


def count_tasks(uid: int) -> int:
    """Threads of every process of ``uid`` (what RLIMIT_NPROC counts)."""
    total = 0
    for pid, (_, u, *_) in _table().items():
        if u == uid:
            try:
                total += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                pass
    return total
