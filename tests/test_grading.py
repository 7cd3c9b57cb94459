"""The exercise machinery: stubs generated and fresh, the grader's negative control,
and a grader that survives crashing and hanging student code."""
import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from lecture_lib import grading
from lecture_lib.grading import stubs


def test_generated_stubs_are_fresh():
    assert stubs.stale() == [], "run `python -m lecture_lib.grading stubs`"


def test_every_exercise_has_tests():
    for solution in stubs.SOLUTIONS.glob("ex*.py"):
        ex = stubs.exercise_id(solution)
        assert sorted(grading.TESTS.glob(f"test_{ex}_*.py")), f"{ex} has no tests"


def test_make_stub_replaces_marked_blocks_only():
    source = textwrap.dedent('''\
        def f(x):
            y = 1
            # BEGIN SOLUTION
            return x + y
            # END SOLUTION

        def g():
            # BEGIN SOLUTION
            # STUB: return None  # TODO
            return 2
            # END SOLUTION
        ''')
    stub = stubs.make_stub(source, "ex99")
    assert "return x + y" not in stub and "return 2" not in stub
    assert '    raise NotImplementedError("ex99: your code here")' in stub
    assert "    return None  # TODO" in stub and "y = 1" in stub


def test_make_stub_rejects_unmatched_markers():
    with pytest.raises(ValueError, match="no '# END SOLUTION'"):
        stubs.make_stub("# BEGIN SOLUTION\nx = 1\n")
    with pytest.raises(ValueError, match="unmatched"):
        stubs.make_stub("x = 1\n# END SOLUTION\n")


def test_there_is_a_stub_for_every_solution():
    assert sorted(p.name for p in stubs.EXERCISES.glob("ex*.py")) == sorted(
        p.name for p in stubs.SOLUTIONS.glob("ex*.py"))


@pytest.mark.parametrize("stub", sorted(stubs.EXERCISES.glob("ex*.py")), ids=lambda p: p.stem)
def test_every_stub_scores_zero_with_not_implemented(stub):
    """Negative control: the tests fail cleanly on the stubs, for every exercise (one test
    per exercise, so that pytest-xdist spreads them over the workers)."""
    (r,) = grading.grade(stub, timeout=240)
    assert r.exercise == stubs.exercise_id(stub)
    assert r.total > 0 and r.passed == 0 and r.points == 0, r
    assert "NotImplementedError" in r.first_failure, r


def test_solution_scores_full_marks_and_json(tmp_path, capsys):
    out = tmp_path / "grades.json"
    grading.main(["grade", str(stubs.SOLUTIONS / "ex00_ring_sum.py"), "--json", str(out)])
    (row,) = json.loads(out.read_text())
    assert row["exercise"] == "ex00" and row["passed"] == row["total"] > 0
    assert row["points"] == row["max_points"] == 10
    assert "10/10" in capsys.readouterr().out


def test_one_command_line_for_grading_release_and_stubs():
    """``python -m lecture_lib.grading`` is the one entry: ``grade`` (above), ``stubs``, and
    ``release`` (tests/test_release.py) through one parser; the old entry points
    (``lecture_lib.grade``, ...) are gone."""
    done = subprocess.run([sys.executable, "-m", "lecture_lib.grading", "stubs", "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "up to date" in done.stdout, done.stdout + done.stderr
    with pytest.raises(SystemExit):
        grading.main([])
    assert [m for m in ("grade", "release", "exercises")
            if importlib.util.find_spec(f"lecture_lib.{m}")] == []


def _student(tmp_path, body):
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "ex00_ring_sum.py").write_text(textwrap.dedent(body))
    return folder


def test_crashing_code_scores_zero(tmp_path):
    folder = _student(tmp_path, "import os\nos._exit(3)\n")
    (r,) = grading.grade(folder, timeout=120)
    assert r.points == 0 and r.passed == 0 and r.first_failure


def test_hanging_code_scores_zero_within_the_limit(tmp_path):
    folder = _student(tmp_path, """\
        import time
        def ring_sum(tensor):
            time.sleep(3600)
        """)
    (r,) = grading.grade(folder, timeout=20)
    assert r.points == 0 and "timed out" in r.first_failure


def test_partial_credit_and_extra_tests(tmp_path):
    # Right on one rank only: the 1-rank test passes, the others fail.
    folder = _student(tmp_path, """\
        def ring_sum(tensor):
            return tensor.clone()
        """)
    extra = tmp_path / "private"
    extra.mkdir()
    (extra / "test_ex00_private.py").write_text("def test_private():\n    assert True\n")
    (r,) = grading.grade(folder, extra=extra, timeout=120)
    assert 0 < r.passed < r.total and 0 < r.points < r.max_points
    pack = [t for t in r.tests if t["name"] != "test_private"]
    assert len(pack) == r.total - 1 >= 5   # the pack's tests (each parametrization) + 1 private
    assert any(t["name"] == "test_private" and t["passed"] for t in r.tests)


def test_bad_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        grading.grade(tmp_path / "nope")
    (tmp_path / "notes.py").write_text("")
    with pytest.raises(ValueError, match="exNN_topic.py"):
        grading.grade(tmp_path / "notes.py")

