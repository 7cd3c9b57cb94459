"""Calling the library's answer earns nothing, and the tests check each exercise's point.

* In the sandbox, an exercise's answer in the library (lecture_lib.grading.harness.ANSWERS)
  refuses the submission by every route a student takes: a direct call, an alias (also under
  the exercise's own name), ``getattr``, ``functools.partial``, a subclass, a dispatcher such
  as ``make_schedule``, a thread, a reload or a fresh import; the tests' own code keeps using
  it. ex00/ex01's collectives are refused at every level Python reaches.
* Shortcuts and wrong-but-plausible submissions (tests/shortcuts/, one file each, its header
  saying what it does, which exercise file it is graded as, and what a failing test must say),
  graded by the real command, score less than full marks, and their failures say what is
  missing; a correct solution that makes a choice the statement leaves open scores full.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tamper_routes import LIBRARY_ANSWER

from lecture_lib.grading import Limits, stubs
from lecture_lib.grading.harness import Exercise

ROOT = stubs.ROOT


def _exercise(tmp_path: Path, name: str, body: str) -> Exercise:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return Exercise(stubs.exercise_id(name), path, Limits(wall_s=120))


# ----------------------------------------------------------------------------
# Refused by every route (the sandbox on its own: one child, one rank pool)
# ----------------------------------------------------------------------------

COLLECTIVE_ROUTES = """\
    import concurrent.futures
    import torch
    import torch.distributed as dist
    from lecture_lib import collectives

    def by_dist(t):
        dist.all_reduce(t)

    def by_group(t):
        dist.distributed_c10d._get_default_group().allreduce([t]).wait()

    def by_backend(t):
        group = dist.distributed_c10d._get_default_group()
        group._get_backend(torch.device("cpu")).allreduce([t]).wait()

    def by_inference_mode(t):
        with torch.inference_mode():
            dist.all_reduce(t)

    def by_functional(t):
        import torch.distributed._functional_collectives as funcol
        return funcol.all_reduce(t, "sum", dist.group.WORLD) + 0

    def by_ddp(t):
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))

    def by_all_gather_object(t):
        dist.all_gather_object([None] * dist.get_world_size(), t.tolist())

    def by_store(t):
        dist.distributed_c10d._get_default_store().set("sum", "1")

    def by_thread(t):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(dist.all_reduce, t).result()

    def by_library(t):
        return collectives.ring_all_reduce(t)

    ring_sum = collectives.ring_all_reduce          # the exercise's own name, an alias

    def by_send_recv(t):                             # allowed: point to point
        rank, p = dist.get_rank(), dist.get_world_size()
        other = torch.empty_like(t)
        request = dist.isend(t, (rank + 1) % p)
        dist.recv(other, (rank - 1) % p)
        request.wait()
        return t + other
    """
ROUTES = ["by_dist", "by_group", "by_backend", "by_inference_mode", "by_functional", "by_ddp",
          "by_all_gather_object", "by_store", "by_thread", "by_library", "ring_sum"]


def _try_every_route(ex):
    """On a rank: each route's refusal (or its result), then the tests' own collectives."""
    out = {}
    for name in ROUTES:
        try:
            getattr(ex, name)(torch.ones(3))
            out[name] = "not refused"
        except AssertionError as exc:              # the refusal: LibraryAnswerRefused
            out[name] = str(exc)
    out["send/recv"] = ex.by_send_recv(torch.ones(3)).tolist()
    mine = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(mine)                          # the test's own code: still allowed
    out["test's all_reduce"] = mine.tolist()
    return out


def test_every_route_to_a_collective_is_refused(tmp_path):
    ex = _exercise(tmp_path, "ex00_ring_sum.py", COLLECTIVE_ROUTES)
    try:
        results = ex.run(_try_every_route, 2, ex, timeout=60)
    finally:
        ex.close()
    for rank, out in enumerate(results):
        for name in ROUTES:
            assert "ex00: " in out[name] and "not allowed" in out[name], (rank, name, out[name])
        assert "collective all-reduce" in out["by_dist"] and "line" in out["by_dist"]
        assert "Backend.allreduce" in out["by_backend"], out["by_backend"]
        assert "rendezvous store" in out["by_store"], out["by_store"]
        assert "a thread your code started" in out["by_thread"], out["by_thread"]
        assert "lecture_lib.collectives.ring_all_reduce" in out["by_library"]
        assert "your ring_sum" in out["ring_sum"], out["ring_sum"]
        assert out["send/recv"] == [2.0, 2.0, 2.0]
        assert out["test's all_reduce"] == [3.0, 3.0]


SCHEDULE_ROUTES = """\
    import concurrent.futures
    import functools
    import importlib
    import sys
    from lecture_lib import pipeline
    from lecture_lib.pipeline import schedules
    from lecture_lib.pipeline.schedules import interleaved_one_f_one_b as mine

    def by_make_schedule():
        return pipeline.make_schedule("interleaved-1f1b", 2, 4, 2)

    def by_alias():
        return mine(2, 4, 2)

    def by_getattr():
        return getattr(schedules, "interleaved_" + "one_f_one_b")(2, 4, 2)

    by_partial = functools.partial(schedules.interleaved_one_f_one_b, 2, 4)

    def by_thread():
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(pipeline.make_schedule, "interleaved-1f1b", 2, 4, 2).result()

    def by_reload():
        return importlib.reload(schedules).interleaved_one_f_one_b(2, 4, 2)

    def by_fresh_import():
        del sys.modules["lecture_lib.pipeline.schedules"]
        fresh = importlib.import_module("lecture_lib.pipeline.schedules")
        sys.modules["lecture_lib.pipeline.schedules"] = schedules
        return fresh.interleaved_one_f_one_b(2, 4, 2)

    class Borrowed:                     # a library function as a method of its own class
        build = schedules.interleaved_one_f_one_b

    def allowed():                      # 1F1B is not this exercise's answer
        return len(pipeline.make_schedule("1f1b", 2, 4).actions)
    """


def _try_schedule_routes(ex):
    """In the child: each route's refusal, then the tests' own call of the same schedule."""
    from lecture_lib.pipeline import make_schedule  # noqa: PLC0415  (the child's own import)
    out = {}
    for name, call in [("by_make_schedule", ex.by_make_schedule), ("by_alias", ex.by_alias),
                       ("by_getattr", ex.by_getattr), ("by_partial", lambda: ex.by_partial(2)),
                       ("by_thread", ex.by_thread), ("by_reload", ex.by_reload),
                       ("by_fresh_import", ex.by_fresh_import),
                       ("by_borrowed_method", lambda: ex.Borrowed().build(4, 2))]:
        try:
            call()
            out[name] = "not refused"
        except AssertionError as exc:
            out[name] = str(exc)
    out["allowed"] = ex.allowed()
    out["test's own"] = len(make_schedule("interleaved-1f1b", 2, 4, 2).actions)
    return out


def test_the_library_answer_is_refused_by_any_route(tmp_path):
    ex = _exercise(tmp_path, "ex06_interleaved_1f1b.py", SCHEDULE_ROUTES)
    try:
        out = ex.call(_try_schedule_routes, ex)
    finally:
        ex.close()
    for name, message in out.items():
        if name.startswith("by_"):
            assert message.startswith("ex06: ") and "not allowed" in message, (name, message)
            assert "interleaved_one_f_one_b" in message and "library's answer" in message
    assert "line" in out["by_make_schedule"] and "your by_partial" in out["by_partial"]
    assert "your Borrowed (a class of your module)" in out["by_borrowed_method"]
    assert out["allowed"] == 2 and out["test's own"] == 2


# One call per exercise that the graded folders below do not cover: the answer refused on a
# rank, and the tests' own code (the same call, outside the submission) still served.
ANSWER_CALLS = {
    "ex03_zero1_optimizer.py": ("""\
        import torch
        from lecture_lib.zero import ShardedOptimizer as _ZeRO

        class ShardedOptimizer(_ZeRO):
            pass

        def cheat():
            ShardedOptimizer([torch.nn.Parameter(torch.ones(4))], torch.optim.SGD, lr=0.1)
        """, "lecture_lib.zero.sharded_optimizer.ShardedOptimizer"),
    "ex05_tensor_parallel.py": ("""\
        import torch
        from lecture_lib.tensor_parallel import copy_to_tensor_parallel

        def cheat():
            copy_to_tensor_parallel(torch.ones(2, requires_grad=True)).sum().backward()
        """, "lecture_lib.tensor_parallel.comm.copy_to_tensor_parallel"),
    "ex08_moe_dispatch.py": ("""\
        from types import SimpleNamespace
        import torch
        from lecture_lib.expert_parallel import exchange_counts

        def cheat():
            exchange_counts(SimpleNamespace(counts=torch.ones(1, 4), counts_all=None,
                                            probs=torch.ones(3, 4)))
        """, "lecture_lib.expert_parallel.dispatch.exchange_counts"),
    "ex12_fsdp_unit.py": ("""\
        import torch
        from lecture_lib.zero import FullyShardedModel

        def cheat():
            FullyShardedModel(torch.nn.Sequential(torch.nn.Linear(4, 4)))
        """, "lecture_lib.zero.fsdp.FullyShardedModel"),
}


def _cheat_then_own(ex, name):
    try:
        ex.cheat()
        refused = "not refused"
    except AssertionError as exc:
        refused = str(exc)
    own = {"ex03": lambda: __import__("lecture_lib.zero", fromlist=["x"]).ShardedOptimizer(
               [torch.nn.Parameter(torch.ones(4))], torch.optim.SGD, lr=0.1),
           "ex05": lambda: __import__("lecture_lib.tensor_parallel", fromlist=["x"])
           .copy_to_tensor_parallel(torch.ones(2)),
           "ex08": lambda: None, "ex12": lambda: None}[name[:4]]
    own()                                   # the test's own code: served
    return refused


@pytest.mark.parametrize("name", sorted(ANSWER_CALLS))
def test_each_answer_refuses_the_submission_but_serves_the_tests(name, tmp_path):
    body, call = ANSWER_CALLS[name]
    ex = _exercise(tmp_path, name, body)
    try:
        results = ex.run(_cheat_then_own, 2, ex, name, timeout=60)
    finally:
        ex.close()
    for message in results:
        assert message.startswith(f"{name[:4]}: your code calls {call}") and \
            "library's answer" in message, message


# ----------------------------------------------------------------------------
# Graded by the real command: less than full marks, and the first failure says why
# ----------------------------------------------------------------------------

#: What a failing test of each library-calling submission must say.
WHY = {name[:4]: "is not allowed" for name in LIBRARY_ANSWER}
#: Graded in groups of a few exercises (one grading command each, under pytest's time limit;
#: xdist spreads the groups).
GROUPS = {f"library-{i}": dict(sorted(LIBRARY_ANSWER.items())[i::5]) for i in range(5)}
SHORTCUTS = sorted((ROOT / "tests" / "shortcuts").glob("ex*.py"))


def _grade(folder: Path, timeout: float = 280):
    out = folder.parent / "grades.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "lecture_lib.grading", "grade", str(folder),
                           "--json", str(out), "--timeout", "200"], cwd=folder.parent, env=env,
                          capture_output=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return {r["exercise"]: r for r in json.loads(out.read_text())}


@pytest.mark.extended
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_calling_the_library_answer_scores_nothing(group, tmp_path):
    folder = tmp_path / "student"
    folder.mkdir()
    for name, text in GROUPS[group].items():
        (folder / name).write_text(text)
    rows = _grade(folder)
    for name in GROUPS[group]:
        ex = name[:4]
        row = rows[ex]
        messages = [t["message"] for t in row["tests"] if not t["passed"]]
        print(f"{group} {ex}: {row['points']:g}/{row['max_points']} ({row['first_failure']})")
        assert row["points"] < row["max_points"], row
        assert any(WHY[ex] in m for m in messages), (ex, WHY[ex], row["first_failure"])
        assert row["passed"] <= _own_checks(ex), row   # every test it would pass by the call


def shortcut_header(path: Path) -> dict:
    """A shortcut file's header: its leading ``# key: value`` lines (``shortcut``: what it
    does; ``graded as``: the exercise file it is graded as; ``scores``: ``full``, or ``at
    most N`` points; ``message``: what a failing test's message must contain)."""
    head = {}
    for line in path.read_text().splitlines():
        if not line.startswith("# ") or ": " not in line:
            break
        key, value = line[2:].split(": ", 1)
        head[key] = value.strip()
    return head


def test_every_shortcut_says_what_it_does_and_how_it_scores():
    assert len(SHORTCUTS) >= 6
    for path in SHORTCUTS:
        head = shortcut_header(path)
        assert {"shortcut", "graded as", "scores"} <= set(head), (path.name, head)
        assert path.name[:4] == head["graded as"][:4], path.name
        assert (stubs.EXERCISES / head["graded as"]).is_file(), path.name
        assert head["scores"] == "full" or (head["scores"].startswith("at most ")
                                            and "message" in head), (path.name, head)


@pytest.mark.extended
@pytest.mark.parametrize("path", SHORTCUTS, ids=lambda p: p.stem)
def test_each_shortcut_scores_as_its_header_says(path, tmp_path):
    """A shortcut scores clearly less than full marks and a failing test names what it
    skipped; a correct solution that makes a choice the statement leaves open scores full."""
    head = shortcut_header(path)
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / head["graded as"]).write_text(path.read_text())
    row = _grade(folder)[path.name[:4]]
    print(f"{path.stem}: {row['points']:g}/{row['max_points']} ({row['first_failure']})")
    if head["scores"] == "full":
        assert row["points"] == row["max_points"], row
        return
    assert row["points"] <= float(head["scores"].removeprefix("at most ")), row
    messages = [t["message"] for t in row["tests"] if not t["passed"]]
    assert any(head["message"] in m for m in messages), (head["message"], row["first_failure"])


def _own_checks(ex: str) -> int:
    """Tests a library-calling submission passes on its own code: its ValueError checks,
    written before it calls the library."""
    return {"ex02": 1, "ex14": 13}.get(ex, 0)


def test_every_exercise_names_its_answer_and_each_name_exists():
    """Every exercise has its answer named (ANSWERS); a name that no longer exists in the
    library is caught here, not silently left unguarded."""
    import importlib  # noqa: PLC0415

    from lecture_lib.grading.answers import ANSWERS  # noqa: PLC0415
    assert sorted(ANSWERS) == sorted(stubs.exercise_id(p)
                                     for p in stubs.SOLUTIONS.glob("ex*.py"))
    for ex, answer in ANSWERS.items():
        for call in answer.calls:
            module, _, name = call.partition(":")
            if not module.startswith("lecture_lib"):
                continue                 # torch's: imported only where a student imports them
            obj = importlib.import_module(module)
            for part in name.split("."):
                obj = getattr(obj, part)
            assert callable(obj), (ex, call)
