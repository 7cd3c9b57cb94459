"""The grader's trust boundary: submissions that tamper instead of computing score 0 on that
exercise only, the grader keeps running and scores the others, and nothing they started
survives. Each route is run through the real command, ``python -m lecture_lib.grading grade``, on
a folder with the tampering ex00 and the worked ex04 (cheap, and must keep its 10/10).

Routes whose signals cannot hide one another share one submission (one grading run), and
each route's own checks still hold it to account. The two that leave a process behind,
``rewrite_report`` and ``fork_survivor`` (each writes its own pidfile), change no test's
outcome and no value ``ring_sum`` returns, so each rides with another route:
``rewrite_report`` with ``patch_testing`` (whose broken defence would show as tests passing on
the zeroed tensors, so nothing in its file may change what ``ring_sum`` returns) and
``fork_survivor`` with ``unpickle_runs_code``. The others hide one another and have a run of
their own: ``unpickle_runs_code`` and ``raw_pickle`` return an object instead of the zeroed
tensor, the flood kills the ranks at the file-size limit, the kill ends the tests' process
and the allocation ends the import. In a shared file the route that defines the ``ring_sum``
returned comes last."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tamper_routes import ROUTES

from lecture_lib.grading import stubs

ROOT = stubs.ROOT
# What the first failure must say, per route (others: any failure line). The payload of
# unpickle_runs_code runs where the ranks' results are unpickled: in the sandbox, harmlessly.
FIRST_FAILURE = {
    "raw_pickle": "refuses to decode",
    "exhaust_memory": "ex00: exceeded 4 GiB of memory",
}
#: The submissions graded, each a tuple of routes in one ex00 file (see the docstring).
#: (The longest first, so that pytest-xdist starts them early.)
GROUPS = [("exhaust_memory",), ("flood_stdout",), ("patch_testing", "rewrite_report"),
          ("fork_survivor", "unpickle_runs_code"), ("raw_pickle",), ("kill_parent_group",)]


def test_every_route_is_graded_once():
    assert sorted(r for group in GROUPS for r in group) == sorted(ROUTES)


def _grade(folder: Path, *extra: str, timeout: float = 420):
    out = folder.parent / "grades.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "lecture_lib.grading", "grade", str(folder),
                           "--json", str(out), "--timeout", "240", *extra], cwd=folder.parent,
                          env=env, capture_output=True, timeout=timeout, start_new_session=True)
    rows = json.loads(out.read_text()) if out.exists() else None
    return proc, {r["exercise"]: r for r in rows or []}


def _alive(pidfile: Path) -> bool:
    if not pidfile.exists():
        return False
    pid = int(pidfile.read_text())
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("routes", GROUPS, ids="+".join)
def test_tampering_scores_zero_and_the_grader_goes_on(routes, tmp_path):
    folder = tmp_path / "student"
    folder.mkdir()
    pidfiles = {route: tmp_path / f"{route}.pid" for route in routes}
    (folder / "ex00_ring_sum.py").write_text("\n".join(
        ROUTES[route].format(pidfile=pidfiles[route]) for route in routes))
    shutil.copy(stubs.SOLUTIONS / "ex04_memory_per_device.py", folder)
    proc, rows = _grade(folder)
    time.sleep(1.0)                          # a survivor would still be rewriting the report
    rows_after = {r["exercise"]: r for r in json.loads((tmp_path / "grades.json").read_text())}
    assert proc.returncode == 0, proc.stdout.decode(errors="replace")[-3000:]
    assert rows_after == rows, "the report changed after the grader wrote it"
    ex00, ex04 = rows["ex00"], rows["ex04"]
    name = "+".join(routes)
    print(f"{name}: ex00 {ex00['points']:g}/10 ({ex00['first_failure']}); "
          f"ex04 {ex04['points']:g}/10")                       # shown by pytest -rP
    # (total is 0 when the tests' process itself was killed: kill_parent_group, same user)
    assert ex00["points"] == 0 and ex00["passed"] == 0 and ex00["first_failure"], ex00
    for route in routes:
        if route in FIRST_FAILURE:
            assert FIRST_FAILURE[route] in ex00["first_failure"], (route, ex00)
    assert ex04["points"] == ex04["max_points"] == 10, ex04
    for route, pidfile in pidfiles.items():
        assert not _alive(pidfile), f"{route}: a process the submission started survived"
    assert len(proc.stdout) < 2**20, "the submission's output reached the grader unbounded"
