"""The sandbox on its own: data-only replies, each resource limit with its first-failure line,
useful feedback (a deadlock's stacks, an exception's type), and a user id of its own where
the grader runs as root."""
import io
import os
import pickle
import textwrap
from pathlib import Path

import pytest
import torch

import lecture_lib
from lecture_lib.grading import ForbiddenValue, LimitExceeded, Limits, safe_load
from lecture_lib.grading.harness import Exercise
from lecture_lib.grading.isolation import separate_user_possible
from lecture_lib.models import TrainResult
from lecture_lib.pipeline.schedules import Action


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_data_round_trip_and_refusals():
    value = {"t": torch.arange(4.0)[1:3], "n": [1, 2.5, None, "s", (True, b"x")],
             "r": TrainResult([1.0], {"w": torch.ones(2)}), "a": [Action("F", 0)]}
    back = safe_load.decode(safe_load.encode(safe_load.to_data(value)))
    assert torch.equal(back["t"], torch.tensor([1.0, 2.0])) and back["n"] == value["n"]
    assert isinstance(back["r"], TrainResult) and torch.equal(back["r"].params["w"], torch.ones(2))
    assert back["a"] == [Action("F", 0)]
    with pytest.raises(ForbiddenValue, match="_Evil, which cannot cross"):
        safe_load.to_data([_Evil()])
    with pytest.raises(ForbiddenValue, match="refuses to decode"):
        safe_load.decode(pickle.dumps(_Evil()))               # raw pickle: refused, not run
    buffer = io.BytesIO()
    torch.save({"x": _Evil()}, buffer)                        # a torch.save'd object: refused
    with pytest.raises(ForbiddenValue, match="refuses to decode"):
        safe_load.decode(buffer.getvalue())
    forged = safe_load.encode({"__lecture_lib_dataclass__": "os.system", "fields": {}})
    with pytest.raises(ForbiddenValue, match="does not rebuild"):
        safe_load.decode(forged)


def _exercise(tmp_path: Path, body: str, **limits) -> Exercise:
    path = tmp_path / "ex00_ring_sum.py"
    path.write_text(textwrap.dedent(body))
    return Exercise("ex00", path, Limits(**limits))


def test_limits_each_give_a_clear_first_line(tmp_path):
    ex = _exercise(tmp_path, """\
        import time, torch
        def burn():
            while True:
                pass
        def hog():
            return [torch.ones(2**26) for _ in range(64)]
        def write(path):
            open(path, "wb").write(b"x" * 2**21)
        def nap():
            time.sleep(3600)
        def ok():
            return 42
        """, cpu_s=3, memory_gib=2, file_mib=1, wall_s=20)
    try:
        with pytest.raises(LimitExceeded, match=r"^ex00: exceeded 2 GiB of memory$"):
            ex.hog()
        assert ex.ok() == 42                                 # the child serves on
        with pytest.raises(LimitExceeded, match=r"^ex00: exceeded the file-size limit of 1 MiB"):
            ex.write("big")                          # in its own scratch folder (its cwd)
        with pytest.raises(LimitExceeded, match=r"^ex00: exceeded 3 s of CPU time$"):
            ex.burn()
        with pytest.raises(LimitExceeded, match=r"^ex00: exceeded the wall-time limit of 20 s"):
            ex.nap()
        assert ex.ok() == 42                                 # a fresh child after each kill
    finally:
        ex.close()


def test_feedback_types_and_deadlock_stacks(tmp_path):
    ex = _exercise(tmp_path, """\
        import torch, torch.distributed as dist
        def ring_sum(tensor):
            if tensor.numel() == 0:
                raise ValueError("empty")
            dist.recv(tensor, (dist.get_rank() - 1) % dist.get_world_size())   # all wait
            return tensor
        """)
    try:
        with pytest.raises(ValueError, match="empty") as info:
            ex.ring_sum(torch.ones(0))
        assert "raised in the submission" in str(info.value) + "".join(
            getattr(info.value, "__notes__", []))
        with pytest.raises(lecture_lib.RankTimeout) as info:
            ex.run(lambda: ex.ring_sum(torch.ones(2)), 2, timeout=8)
        assert "ring_sum" in str(info.value) and "recv" in str(info.value)
        assert set(info.value.stacks) == {0, 1}
    finally:
        ex.close()


@pytest.mark.skipif(not separate_user_possible("/usr/bin/python3.11")
                    or not Path("/usr/bin/python3.11").exists(),
                    reason="needs root and an interpreter every user can run")
def test_separate_user_cannot_signal_the_grader(tmp_path, monkeypatch):
    monkeypatch.setenv("LECTURE_SANDBOX_PYTHON", "/usr/bin/python3.11")
    ex = _exercise(tmp_path, """\
        import os, signal
        def whoami():
            return os.getuid()
        def kill_grader():
            os.kill(os.getppid(), signal.SIGKILL)
        def spawn(n):
            import subprocess
            return [subprocess.Popen(["sleep", "60"]).pid for _ in range(n)]
        """, processes=16)
    try:
        assert ex.whoami() != 0
        with pytest.raises(PermissionError):
            ex.kill_grader()
        with pytest.raises(LimitExceeded, match="exceeded 16 processes"):
            ex.spawn(64)
    finally:
        ex.close()
