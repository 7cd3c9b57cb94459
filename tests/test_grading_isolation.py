"""No submission touches another's grade, whoever runs the grader.

An instructor grades a class on a laptop as an ordinary user: the test creates one (it needs
root, as CI is), puts a student release in its 0700 home with a class of two students, and
runs ``python -m lecture_lib.grading grade`` as that user, one student at a time. Alice's
ex13 tries, at import, to rewrite ex14's tests (so that her unwritten ex14 would score 10/10),
the library, Bob's submission and both results files. Each attempt fails, Alice's ex14 stub
still scores 0, Bob's grade is what his code earns, and the report names the isolation.

The same class graded with the weakest isolation forced (``same user``: the platform has
neither a user id to spare nor namespaces) shows the last line of defence: the rewrite
succeeds on disk, the grader finds it by hash, restores the files and scores Alice's ex13 0,
and her ex14 still scores 0.
"""
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest
from grading_users import enterable_by_all, venv_seeing_ours

from lecture_lib.grading import isolation, stubs
from lecture_lib.grading.release import release

USER = "lecture_grader_test"
ROOT = stubs.ROOT

# Alice's ex13: at import, every write an attacker would try; what happened is printed (the
# grader shows a failing test's output) and every function is wrong, so it earns nothing.
TAMPER_EX13 = '''
import json
TARGETS = {targets!r}
for what, path in TARGETS.items():
    try:
        with open(path, "w") as f:
            f.write(json.dumps({{"score": 1000}}) if path.endswith(".json")
                    else "def test_everything_is_fine():\\n    pass\\n")
        print("TAMPER", what, "WROTE", path)
    except OSError as exc:
        print("TAMPER", what, "REFUSED", type(exc).__name__)

def merge(*args):
    raise ValueError("no")

def ring_step(*args):
    raise ValueError("no")

def ring_attention(q, k, v):
    return q * 0
'''


def _digest(*roots: Path) -> dict:
    out = {}
    for root in roots:
        for p in sorted([root] if root.is_file() else root.rglob("*.py")):
            if "__pycache__" not in p.parts:
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def ordinary_user():
    """A user created for the test, with a 0700 home; removed after (processes, home, user)."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("creates an ordinary user: needs root and useradd/runuser (CI has both)")
    subprocess.run(["userdel", "-r", USER], capture_output=True)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True)
    home = Path(pwd.getpwnam(USER).pw_dir)
    home.chmod(0o700)
    try:
        yield home
    finally:
        subprocess.run(["pkill", "-KILL", "-u", USER], capture_output=True)
        time.sleep(0.5)
        subprocess.run(["userdel", "-r", USER], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def course(ordinary_user):
    """The user's own copy of the course (a student release), a venv it can run, and a class
    folder; everything owned by the user, nothing of it readable by other users."""
    home = ordinary_user
    course = home / "course"
    release(course)
    python = venv_seeing_ours(home / "venv", home / "base-site")
    shutil.chown(home, USER, USER)
    for p in home.rglob("*"):
        if not p.is_symlink():
            shutil.chown(p, USER, USER)
    return home, course, python


def _class(home: Path, course: Path, name: str) -> dict:
    """A fresh class folder: Alice (a tampering ex13, the unwritten ex14 stub) and Bob (the
    worked ex00)."""
    klass = home / name
    alice, bob = klass / "alice", klass / "bob"
    for d in (alice, bob):
        d.mkdir(parents=True)
    targets = {"ex14 tests": course / "tests" / "exercises" / "test_ex14_ddp_step_time.py",
               "library": course / "lecture_lib" / "models.py",
               "sibling": bob / "ex00_ring_sum.py",
               "results": klass / "alice.json", "other results": klass / "bob.json"}
    (alice / "ex13_ring_attention.py").write_text(
        TAMPER_EX13.format(targets={k: str(v) for k, v in targets.items()}))
    shutil.copy(course / "exercises" / "ex14_ddp_step_time.py", alice)
    shutil.copy(stubs.SOLUTIONS / "ex00_ring_sum.py", bob)
    for p in [klass, *klass.rglob("*")]:
        shutil.chown(p, USER, USER)
    return {"dir": klass, "alice": alice, "bob": bob, "targets": targets}


def _grade_as_user(home, course, python, folder: Path, out: Path, mode: str | None):
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "PYTHONPATH": str(course), "OMP_NUM_THREADS": "1", "USER": USER}
    if mode:
        env[isolation.ENV] = mode
    with enterable_by_all(Path(os.path.realpath(python)), Path(sysconfig.get_paths()["purelib"])):
        proc = subprocess.run(["runuser", "-u", USER, "--", "env", *[f"{k}={v}" for k, v in
                               env.items()], str(python), "-m", "lecture_lib.grading", "grade",
                               str(folder), "--json", str(out), "--timeout", "240"],
                              cwd=course, capture_output=True, text=True, timeout=600)
    print(f"--- grading {folder.name} as {USER} (exit {proc.returncode}) ---\n"
          f"{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["exercise"]: r for r in json.loads(out.read_text())}, proc.stderr


def _tamper_lines(row: dict) -> list[str]:
    return [ln for t in row["tests"] for ln in t.get("output", "").splitlines() if "TAMPER" in ln]


@pytest.mark.timeout(1200)
def test_an_ordinary_user_grading_a_class_keeps_every_grade(course):
    home, pack, python = course
    if isolation.bubblewrap() is None:
        pytest.skip(f"bubblewrap cannot start a sandbox here: {isolation.FIX}")
    klass = _class(home, pack, "class")
    before = _digest(pack / "tests", pack / "lecture_lib", klass["bob"])
    alice, said = _grade_as_user(home, pack, python, klass["alice"],
                                 klass["dir"] / "alice.json", None)
    bob, _ = _grade_as_user(home, pack, python, klass["bob"], klass["dir"] / "bob.json", None)

    assert "isolation: namespace" in said and "read-only" in said
    assert _digest(pack / "tests", pack / "lecture_lib", klass["bob"]) == before
    tried = _tamper_lines(alice["ex13"])
    assert len(tried) >= 5 and all("REFUSED" in ln for ln in tried), tried
    assert alice["ex14"]["points"] == 0 and "NotImplementedError" in alice["ex14"]["first_failure"]
    assert alice["ex13"]["points"] == 0
    assert bob["ex00"]["points"] == bob["ex00"]["max_points"] == 10
    assert {r["isolation"] for r in [*alice.values(), *bob.values()]} == {isolation.NAMESPACE}


@pytest.mark.timeout(1200)
def test_without_isolation_the_grader_restores_what_it_reads_and_scores_it_zero(course):
    home, pack, python = course
    klass = _class(home, pack, "class-weak")
    before = _digest(pack / "tests", pack / "lecture_lib")
    alice, said = _grade_as_user(home, pack, python, klass["alice"],
                                 klass["dir"] / "alice.json", isolation.SAME_USER)

    assert "WEAK" in said and "bubblewrap" in said          # said once, with the fix
    assert _digest(pack / "tests", pack / "lecture_lib") == before
    assert alice["ex13"]["points"] == 0
    assert "changed files the grader reads" in alice["ex13"]["first_failure"]
    assert "test_ex14_ddp_step_time.py" in alice["ex13"]["first_failure"]
    assert alice["ex14"]["points"] == 0 and "NotImplementedError" in alice["ex14"]["first_failure"]
    assert {r["isolation"] for r in alice.values()} == {isolation.SAME_USER}
