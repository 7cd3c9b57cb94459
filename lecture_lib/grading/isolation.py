"""What keeps a submission from the grader's files: the strongest isolation the platform gives.

A submission runs in a sandboxed child (:mod:`.sandbox`). What it may *write* depends on
how the child is started, chosen once per grading run:

* ``separate user``: the grader is root and every user can run the interpreter (a
  Gradescope container). The child runs under a user id of its own: it can write none of the
  grader's files and signal none of its processes.
* ``namespace``: bubblewrap (``bwrap``, Debian's ``bubblewrap``) starts the child in new user,
  mount, pid and IPC namespaces, as any user: the whole file system is read-only to it except
  its own scratch folder, ``/tmp`` is its own, and it sees only its own processes.
* ``same user`` (weak): neither is available (macOS; Linux without bubblewrap, or with
  unprivileged user namespaces turned off). The child runs as the grader's user, so the
  operating system lets it write what that user may write. The grader says so once, with the
  fix.

In every mode the grader also hashes what it reads (the exercise tests, the instructor's extra
tests, the library, the submitted files) before any submission runs, checks them after each
exercise, restores what changed and scores that exercise 0 (:class:`Snapshot`): the last line
of defence, the only one in ``same user`` mode.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SEPARATE_USER, NAMESPACE, SAME_USER = "separate user", "namespace", "same user"
MODES = (SEPARATE_USER, NAMESPACE, SAME_USER)
#: Set by the grader for its test processes (so every sandbox of a run uses the mode it chose
#: and reported), or by an instructor to force a weaker mode (``same user``) for a test.
ENV = "LECTURE_SANDBOX_ISOLATION"
FIX = ("install bubblewrap (Debian/Ubuntu: sudo apt-get install bubblewrap; Fedora: sudo dnf "
       "install bubblewrap), or grade as root in a container whose Python every user can read "
       "(README, 'As a Gradescope autograder')")
DESCRIPTION = {
    SEPARATE_USER: "each submission runs under a user id of its own: it can write none of your "
                   "files and signal none of your processes",
    NAMESPACE: "each submission runs in its own namespaces (bubblewrap): the file system is "
               "read-only to it except its own scratch folder",
    SAME_USER: "WEAK: submissions run as you, so they can write any file you can; the grader "
               "checks what it reads by hash after each exercise, restores it and scores that "
               "exercise 0, but a submission can still change files it does not read",
}


def readable_by_all(path: Path) -> bool:
    """Every user can read ``path`` and enter every folder above it."""
    for part in [path, *path.parents]:
        need = stat.S_IXOTH if part.is_dir() else stat.S_IROTH
        if not part.stat().st_mode & need:
            return False
    return True


def separate_user_possible(python: str) -> bool:
    """We are root, and every user can run ``python`` with torch and this pack."""
    if os.geteuid() != 0:
        return False
    import torch  # noqa: PLC0415  (only its location matters here)
    return all(readable_by_all(Path(p).resolve())
               for p in (python, torch.__file__, __file__))


@functools.lru_cache(maxsize=1)
def bubblewrap() -> str | None:
    """The ``bwrap`` binary, when it can start a sandbox here (unprivileged user namespaces may
    be switched off, e.g. by AppArmor); else None."""
    path = shutil.which("bwrap")
    if path is None or not sys.platform.startswith("linux"):
        return None
    probe = subprocess.run([path, *bwrap_args("/tmp"), "--", "true"], capture_output=True,
                           timeout=30)
    return path if probe.returncode == 0 else None


def bwrap_args(scratch: str | Path) -> list[str]:
    """bubblewrap's options: everything read-only but ``scratch``; private /tmp, /dev, /proc;
    new user, pid, IPC and UTS namespaces; no capabilities; killed with its parent."""
    scratch = str(scratch)
    return ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--bind", scratch, scratch, "--unshare-user", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--disable-userns", "--cap-drop", "ALL",
            "--die-with-parent", "--new-session", "--chdir", scratch]


def choose(python: str = sys.executable) -> str:
    """The isolation for this run: the mode named in ``$LECTURE_SANDBOX_ISOLATION`` (the
    grader's choice, or a weaker one an instructor forces), else the strongest available."""
    named = os.environ.get(ENV, "auto")
    if named == "off":                   # the old spelling of "no separate user"
        named = SAME_USER
    if named in MODES:
        if named == SEPARATE_USER and not separate_user_possible(python):
            raise RuntimeError(f"{ENV}={named!r}, but this is not root with an interpreter "
                               "every user can read")
        if named == NAMESPACE and bubblewrap() is None:
            raise RuntimeError(f"{ENV}={named!r}, but bubblewrap cannot start here: {FIX}")
        return named
    if named != "auto":
        raise ValueError(f"{ENV} must be one of {', '.join(MODES)} or auto, not {named!r}")
    if separate_user_possible(python):
        return SEPARATE_USER
    if bubblewrap() is not None:
        return NAMESPACE
    return SAME_USER


def announcement(mode: str, python: str = sys.executable) -> str:
    """What the grader prints once at its start: the mode, what it means, and (when weaker
    than it could be) why and how to get the stronger one."""
    line = f"isolation: {mode}: {DESCRIPTION[mode]}."
    if mode == NAMESPACE and os.geteuid() == 0:
        line += (" (Not a separate user: the interpreter, torch or this pack is not readable "
                 f"by every user: {python}.)")
    if mode == SAME_USER:
        line += f" To isolate them: {FIX}."
    return line


# -- the last line of defence: what the grader reads, hashed ----------------------------------

@dataclass
class Snapshot:
    """The bytes and hashes of every file under ``roots`` (and the files among them), taken
    before any submission runs; :meth:`changed` lists what differs now, :meth:`restore` puts
    it back."""
    files: dict

    @classmethod
    def take(cls, roots) -> "Snapshot":
        files = {}
        for root in map(Path, roots):
            paths = [root] if root.is_file() else sorted(
                p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            for p in paths:
                data = p.read_bytes()
                files[p] = (hashlib.sha256(data).hexdigest(), data, p.stat().st_mode)
        return cls(files)

    def changed(self) -> list[Path]:
        out = []
        for path, (digest, _, _) in self.files.items():
            try:
                now = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                now = None
            if now != digest:
                out.append(path)
        return out

    def restore(self, paths) -> None:
        for path in paths:
            _, data, mode = self.files[path]
            if path.is_symlink() or path.is_dir():
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(stat.S_IMODE(mode))
