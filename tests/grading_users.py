"""Running the grader as another user, as instructors do: an interpreter every user can run,
a venv of it that sees this environment's packages, and a folder tree other users can enter.

Used by tests/test_gradescope.py (root, then a user id per submission) and
tests/test_grading_isolation.py (an ordinary user created for the test).
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

from lecture_lib.grading.isolation import readable_by_all


def interpreter() -> str:
    """An interpreter of this Python version that every user can run (as /usr/bin/python3 is on
    Gradescope), else this environment's own base interpreter."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys._base_executable, shutil.which(version), f"/usr/bin/{version}",
                      f"/usr/local/bin/{version}"):
        if not candidate or not Path(candidate).is_file() \
                or not readable_by_all(Path(candidate).resolve()):
            continue
        probe = subprocess.run([candidate, "-c", "import sys, venv; print(sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == str(sys.version_info[:2]):
            return candidate
    return sys._base_executable


def venv_seeing_ours(venv: Path, base_site: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """A venv of :func:`interpreter` that sees this environment's packages (a folder of links
    to them) except ``leave_out``'s distributions and this pack's own install, and has no pip
    of its own; returns its python."""
    ours = Path(sysconfig.get_paths()["purelib"])
    hidden = {f.parts[0] for name in leave_out
              for f in importlib.metadata.distribution(name).files
              if not str(f).startswith("..")}
    base_site.mkdir()
    for entry in ours.iterdir():
        name = entry.name
        if (name in hidden or name.endswith(".pth") or name == "__pycache__"
                or name.startswith(("__editable__", "lecture_lib"))):
            continue
        (base_site / name).symlink_to(entry)
    base_site.chmod(0o755)
    subprocess.run([interpreter(), "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "zz_course_base_site.pth").write_text(f"{base_site}\n")
    return python


@contextlib.contextmanager
def enterable_by_all(*paths: Path):
    """Every folder above ``paths`` (and they, if folders) enterable by every user (o+x) for
    the block, as a checkout under /root is not; the modes are put back after."""
    changed = {}
    for path in paths:
        for part in [path.resolve(), *path.resolve().parents]:
            mode = part.stat().st_mode
            if part.is_dir() and not mode & stat.S_IXOTH and part not in changed:
                changed[part] = stat.S_IMODE(mode)
                part.chmod(changed[part] | stat.S_IXOTH)
    try:
        yield
    finally:
        for part, mode in changed.items():
            part.chmod(mode)
