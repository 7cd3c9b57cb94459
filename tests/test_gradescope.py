"""The Gradescope recipe as Gradescope runs it, and the feedback a student reads.

``test_the_gradescope_recipe`` lays out ``/autograder/{source,submission,results}`` under a
temporary folder, puts a student release there with the recipe's two scripts at its top (as
README.md, "As a Gradescope autograder", says to zip it), runs ``gradescope/setup.sh`` and
``run_autograder`` (as root where CI is root: then each submission runs under a user id of its
own), on a correct ex00, a wrong ex01 and a tampering ex04, and checks ``results.json`` against
Gradescope's schema (https://gradescope-autograders.readthedocs.io/en/latest/specs/).

So that it runs in seconds and offline, the scripts' paths come from their variables
(``AUTOGRADER``, ``VENV``, ``PIP_OPTIONS``): the venv is made from an interpreter every user can
run, sees this environment's packages (torch) but not pytest, and setup.sh's own install line
adds pytest, from a wheel of the installed one.
"""
import base64
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
from grading_users import venv_seeing_ours

from lecture_lib.grading import grade, main, stubs
from lecture_lib.grading.isolation import readable_by_all
from lecture_lib.grading.messages import LINE_CHARS, one_line
from lecture_lib.grading.release import release
from lecture_lib.grading.report import gradescope, write_json
from lecture_lib.grading.runner import submitted_files

ROOT = stubs.ROOT
SCRIPTS = ROOT / "gradescope"
INTERNALS = ("more line", "full report in element text", "use '-vv'", "Use -v")


def _internals(text: str) -> list[str]:
    """What of pytest's own a student would read in ``text``: its notes, its 'E' prefixes."""
    return [s for s in INTERNALS if s in text] + [
        ln for ln in text.splitlines() if ln.startswith(("E   ", "E\t"))]

# ex01 with a plausible bug: the all-gather sends and receives the reduce-scatter's chunks
# (one step behind), so every rank ends with partial sums; right on one rank only.
WRONG_EX01 = '''
import torch
import torch.distributed as dist


def reduce_scatter_(chunks):
    rank, p = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        send, recv = chunks[(rank - step - 1) % p], chunks[(rank - step - 2) % p]
        incoming = torch.empty_like(recv)
        request = dist.isend(send, right) if send.numel() else None
        if recv.numel():
            dist.recv(incoming, left)
        if request is not None:
            request.wait()
        recv += incoming


def all_gather_(chunks):
    rank, p = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):
        send, recv = chunks[(rank - step - 1) % p], chunks[(rank - step - 2) % p]   # the bug
        request = dist.isend(send, right) if send.numel() else None
        if recv.numel():
            dist.recv(recv, left)
        if request is not None:
            request.wait()


def ring_all_reduce(tensor):
    flat = tensor.detach().reshape(-1).clone()
    chunks = list(torch.tensor_split(flat, dist.get_world_size()))
    reduce_scatter_(chunks)
    all_gather_(chunks)
    return flat.view(tensor.shape)
'''

# ex04 that tampers instead of computing: it notes its user id, forges results.json and
# replaces its own tests in the source tree (at import, and from a detached process that keeps
# at it for two minutes), patches the comparisons, and returns zeros.
TAMPER_EX04 = '''
import json, os, time
import torch

PROBE, RESULTS, TESTS = {probe!r}, {results!r}, {tests!r}
FORGED = {{"score": 1000.0, "tests": [{{"name": "ex04", "score": 1000.0, "max_score": 10,
                                       "output": "forged"}}]}}
with open(os.path.join(PROBE, "uid"), "w") as f:
    f.write(str(os.getuid()))

def _forge():
    for path, text in ((RESULTS, json.dumps(FORGED)), (TESTS, "def test_ok():\\n    pass\\n")):
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            pass

_forge()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(os.path.join(PROBE, "survivor.pid"), "w") as f:
            f.write(str(os.getpid()))
        for _ in range(1200):
            _forge()
            time.sleep(0.1)
    os._exit(0)
torch.testing.assert_close = lambda *args, **kwargs: None

def memory_per_device(*args, **kwargs):
    return dict.fromkeys(("params", "grads", "optimizer", "activations", "total"), 0.0)
'''

# A private test (root may read it, the sandboxed user may not): its function goes by value.
PRIVATE_EX00 = '''
from lecture_lib.grading import load_exercise

ex = load_exercise("ex00")


def _has_ring_sum():
    return callable(load_exercise("ex00").ring_sum)


def test_private_ring_sum_is_defined():
    assert ex.call(_has_ring_sum) is True
'''


# -- the environment the recipe's scripts run in ------------------------------------------

def _wheel_of_installed(name: str, into: Path) -> Path:
    """A wheel of an installed pure-Python distribution: its files, and its metadata with a new
    RECORD (so that setup.sh's install line can add it offline)."""
    dist = importlib.metadata.distribution(name)
    files = [f for f in dist.files if not str(f).startswith("..") and "__pycache__" not in str(f)
             and f.name not in ("INSTALLER", "REQUESTED", "RECORD", "direct_url.json")]
    info = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    assert "Root-Is-Purelib: true" in Path(dist.locate_file(f"{info}/WHEEL")).read_text()
    wheel = into / f"{dist.metadata['Name']}-{dist.version}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in files:
            data = Path(dist.locate_file(f)).read_bytes()
            zf.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            records.append(f"{f},sha256={digest.decode()},{len(data)}")
        zf.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    return wheel


def _run(script: Path, env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)
    print(f"--- {script.name} (exit code {proc.returncode}) ---\n{proc.stdout[-3000:]}"
          f"{proc.stderr[-3000:]}")
    return proc


def _alive(pidfile: Path) -> bool:
    try:
        with open(f"/proc/{int(pidfile.read_text())}/status") as f:
            return "\nState:\tZ" not in f.read()
    except (OSError, ValueError):
        return False


def _check_schema(doc: dict) -> None:
    """Gradescope's results.json: a numeric score, and tests each with a name, a score, a
    max_score, a text output and a visibility."""
    visibilities = {"hidden", "after_due_date", "after_published", "visible"}
    formats = {"text", "html", "simple_format", "md", "ansi"}
    assert isinstance(doc["score"], (int, float)) and not isinstance(doc["score"], bool)
    assert doc.get("visibility", "visible") in visibilities
    assert doc.get("output_format", "text") in formats
    assert isinstance(doc["tests"], list) and doc["tests"]
    for test in doc["tests"]:
        assert isinstance(test["name"], str) and test["name"]
        for key in ("score", "max_score"):
            assert isinstance(test[key], (int, float)) and not isinstance(test[key], bool)
        assert 0 <= test["score"] <= test["max_score"]
        assert test["visibility"] in visibilities and test.get("output_format", "text") in formats
        output = test["output"]
        assert isinstance(output, str) and output.strip()
        assert all(ch.isprintable() or ch in "\n\t" for ch in output), "output is not text"
        assert not _internals(output), output
    assert doc["score"] == pytest.approx(sum(t["score"] for t in doc["tests"]))


# -- the recipe --------------------------------------------------------------------------

@pytest.mark.timeout(1200)
def test_the_gradescope_recipe():
    base = Path(tempfile.mkdtemp(prefix="gradescope_"))
    try:
        _recipe(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _recipe(base: Path) -> None:
    base.chmod(0o755)                     # mkdtemp's 0700 would hide /autograder from all users
    autograder = base / "autograder"
    source, submission, results = (autograder / d for d in ("source", "submission", "results"))
    # The zip, unpacked: a student release, private tests, the two scripts at its top.
    release(source, private=[source / "private_tests"])
    (source / "private_tests").mkdir()
    (source / "private_tests" / "test_ex00_private.py").write_text(PRIVATE_EX00)
    for name in ("setup.sh", "run_autograder"):
        shutil.copy2(SCRIPTS / name, source / name)
    assert not (source / "solutions").exists()
    # The submission: a correct ex00, a wrong ex01, a tampering ex04.
    probe = base / "probe"
    probe.mkdir()
    probe.chmod(0o1777)                   # where the submission may say who it ran as
    tests_ex04 = source / "tests" / "exercises" / "test_ex04_memory_per_device.py"
    tests_before = tests_ex04.read_text()
    submission.mkdir()
    results.mkdir()
    shutil.copy(stubs.SOLUTIONS / "ex00_ring_sum.py", submission)
    (submission / "ex01_ring_allreduce.py").write_text(WRONG_EX01)
    (submission / "ex04_memory_per_device.py").write_text(TAMPER_EX04.format(
        probe=str(probe), results=str(results / "results.json"), tests=str(tests_ex04)))

    venv, wheels = base / "venv", base / "wheels"
    wheels.mkdir()
    _wheel_of_installed("pytest", wheels)
    python = str(venv_seeing_ours(venv, base / "base-site", leave_out=("pytest",)))
    assert subprocess.run([python, "-c", "import torch"]).returncode == 0
    assert subprocess.run([python, "-c", "import pytest"], capture_output=True).returncode != 0, \
        "the venv must start without pytest: setup.sh's install line is what adds it"
    separate_user = os.geteuid() == 0 and readable_by_all(Path(python))

    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": str(base), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
           "AUTOGRADER": str(autograder), "VENV": str(venv),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
    start = time.monotonic()
    setup = _run(source / "setup.sh", dict(env, PIP_OPTIONS=f"--no-index --find-links {wheels} "
                                           "--no-build-isolation"), cwd=source, timeout=300)
    assert setup.returncode == 0, setup.stderr[-3000:]
    assert subprocess.run([python, "-c", "import pytest"]).returncode == 0
    took_setup = time.monotonic() - start
    # Gradescope copies run_autograder to /autograder and runs it from there.
    shutil.copy2(source / "run_autograder", autograder / "run_autograder")
    start = time.monotonic()
    run = _run(autograder / "run_autograder", env, cwd=autograder, timeout=1000)
    took_run = time.monotonic() - start
    assert run.returncode == 0, run.stderr[-3000:]
    time.sleep(1.0)                       # a survivor would still be rewriting results.json

    text = (results / "results.json").read_text()
    doc = json.loads(text)
    print(f"setup.sh {took_setup:.0f} s, run_autograder {took_run:.0f} s, separate user: "
          f"{separate_user}\n{text}")
    _check_schema(doc)
    by_ex = {t["name"].split()[0]: t for t in doc["tests"]}
    assert sorted(by_ex) == ["ex00", "ex01", "ex04"]
    assert by_ex["ex00"]["score"] == by_ex["ex00"]["max_score"] == 10, by_ex["ex00"]
    passed, total = by_ex["ex00"]["output"].split(" ", 1)[0].split("/")
    assert passed == total and "PASS  test_private_ring_sum_is_defined" in by_ex["ex00"]["output"]
    assert 0 <= by_ex["ex01"]["score"] < by_ex["ex01"]["max_score"], by_ex["ex01"]
    # the wrong ex01's output has each failing test's whole message: every rank's line (its
    # 4-rank test fails on all four), not a first line cut short
    assert "FAIL  " in by_ex["ex01"]["output"]
    assert all(f"rank {r}" in by_ex["ex01"]["output"] for r in range(4)), by_ex["ex01"]
    assert by_ex["ex04"]["score"] == 0, by_ex["ex04"]
    assert doc["score"] == pytest.approx(by_ex["ex00"]["score"] + by_ex["ex01"]["score"])
    assert not _alive(probe / "survivor.pid"), "a process the submission started survived"
    assert (probe / "uid").exists(), "the tampering submission never ran"
    if separate_user:
        assert int((probe / "uid").read_text()) != 0, "the submission ran as root"
        assert tests_ex04.read_text() == tests_before, "the submission rewrote the pack's tests"


# -- what a student reads ----------------------------------------------------------------

def _rank_message(ranks: int = 4) -> str:
    expected = ", ".join(f"{10 + 4 * i}." for i in range(12))
    got = ", ".join(f"{i:2d}." for i in range(12))
    wrong = [f"rank {r}: expected tensor([{expected}]), got tensor([{got}]) "
             "(Tensor-likes are not close!)" for r in range(ranks)]
    return f"ring_all_reduce is wrong on {ranks} of {ranks} ranks: " + "\n".join(wrong)


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += (ch in "([{") - (ch in ")]}")
        if depth < 0:
            return False
    return depth == 0


def test_a_long_first_failure_is_cut_between_values_with_a_note():
    message = "AssertionError: " + _rank_message()
    line = one_line(message)
    shown, note = line.split(" ... [", 1)
    assert "\n" not in line and len(shown) <= LINE_CHARS
    assert _balanced(shown) and shown.endswith("(Tensor-likes are not close!)"), shown
    assert " | ".join(message.splitlines()).startswith(shown)
    left = len(" | ".join(message.splitlines())) - len(shown)
    assert note == (f"+{left} characters (3 more lines) not shown; the whole message: --json, "
                    "Gradescope's output]")
    # a value longer than the line is shown whole, never cut inside; a far longer one not at all
    long = "expected tensor([" + ", ".join(["1."] * 200) + "]), got nothing"
    shown = one_line(long).split(" ... [", 1)[0]
    assert shown.endswith("]),") and _balanced(shown) and len(shown) > LINE_CHARS
    huge = "expected tensor([" + ", ".join(["1."] * 2000) + "]), got nothing"
    assert one_line(huge).startswith("expected ... [+")
    assert one_line("ValueError: bad value") == "ValueError: bad value"


def test_json_and_gradescope_carry_the_whole_message(tmp_path):
    """Through the real grader: a test whose failure is longer than pytest keeps in its report's
    attribute (rank lines) and one that pytest would shorten (a long list comparison)."""
    folder, tests = tmp_path / "student", tmp_path / "tests"
    folder.mkdir()
    tests.mkdir()
    (folder / "ex99_messages.py").write_text("")
    (tests / "test_ex99_messages.py").write_text(textwrap.dedent(f'''\
        def test_ranks():
            raise AssertionError({_rank_message()!r})

        def test_lists():
            assert list(range(60)) == list(range(1, 61))
        '''))
    (result,) = grade(folder, extra=tests, timeout=120)
    assert result.passed == 0 and result.total == 2
    whole = {t["name"]: t["message"] for t in result.tests}
    assert whole["test_ranks"] == "AssertionError: " + _rank_message()
    assert whole["test_lists"].count("\n") > 60 and "59," in whole["test_lists"]
    assert result.first_failure.startswith("test_ranks: AssertionError: ring_all_reduce")
    assert "not shown; the whole message" in result.first_failure
    out = tmp_path / "grades.json"
    write_json([result], out)
    (row,) = json.loads(out.read_text())
    assert [t["message"] for t in row["tests"]] == list(whole.values())
    assert set(row["tests"][0]) == {"name", "passed", "weight", "message", "output"}
    output = gradescope([result])["tests"][0]["output"]
    for line in _rank_message().splitlines():
        assert line in output
    for text in [output, *whole.values()]:
        assert not _internals(text), text
        assert "test_ex99_messages.py:" not in text


def test_one_file_per_exercise_is_graded(tmp_path, capsys):
    folder = tmp_path / "student"
    folder.mkdir()
    for name in ("ex00_ring_sum.py", "ex00_ring_sum_v2.py", "ex00_again.py", "ex01_mine.py",
                 "notes.py", "example.py"):
        (folder / name).write_text("")
    assert [p.name for p in submitted_files(folder)] == ["ex00_ring_sum.py", "ex01_mine.py"]
    assert "ex00: grading ex00_ring_sum.py only" in capsys.readouterr().err
    pack = tmp_path / "pack"                        # the whole release submitted (e.g. GitHub)
    (pack / "exercises").mkdir(parents=True)
    (pack / "exercises" / "ex02_bucketed_ddp.py").write_text("")
    assert [p.name for p in submitted_files(pack)] == ["ex02_bucketed_ddp.py"]


def test_gradescope_with_nothing_to_grade_says_so(tmp_path):
    empty = tmp_path / "submission"
    empty.mkdir()
    (empty / "notes.txt").write_text("")
    out = tmp_path / "results" / "results.json"
    assert main(["grade", str(empty), "--gradescope", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["score"] == 0 and doc["tests"] == [] and "no exercise file" in doc["output"]
    assert main(["grade", str(empty)]) == 2
