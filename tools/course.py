"""Open the course: JupyterLab on notebooks/, on a free port, with a token, and say where.

``make course`` runs ``python tools/course.py notebooks``; the browser test
(``tests/browser``) starts the server with :func:`start` exactly the same way,
on a temporary copy of the notebooks. The URL to open (with its token) is
printed once the server answers, after JupyterLab's own start-up log.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_command(root: Path, port: int, token: str, open_browser: bool = True,
                extra: tuple[str, ...] = ()) -> list[str]:
    """The JupyterLab command line of ``make course``."""
    return [sys.executable, "-m", "jupyterlab", str(root), "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.open_browser={open_browser}",
            *(["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []),  # CI containers
            *extra]


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with status {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer at {url} within {timeout:g} s")


def start(root: Path, open_browser: bool = True, extra: tuple[str, ...] = (), **popen):
    """Start JupyterLab on ``root``; return ``(process, url to open)`` once it answers."""
    port, token = free_port(), secrets.token_hex(16)
    proc = subprocess.Popen(lab_command(root, port, token, open_browser, extra),
                            start_new_session=True, **popen)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{base}/api/status?token={token}", proc)
    except BaseException:
        stop(proc)
        raise
    return proc, f"{base}/lab?token={token}"


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """End the server (it shuts its kernels down on SIGTERM), killing it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, nargs="?", default=Path("notebooks"))
    parser.add_argument("--no-browser", action="store_true", help="only print the URL")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))      # like Ctrl-C: stop the server
    proc, url = start(args.root, open_browser=not args.no_browser)
    print(f"\n  The course is running. Open this URL in your browser:\n\n    {url}\n\n"
          "  (Ctrl-C here stops it.)\n", flush=True)
    try:
        return proc.wait()
    except (KeyboardInterrupt, SystemExit):
        return 0
    finally:
        stop(proc)


if __name__ == "__main__":
    sys.exit(main())
