"""The student release (``python -m lecture_lib.grading release DIR``) is a course of its own.

What it holds and what it leaves out, the README it writes for students (naming nothing the
release lacks), the Makefile's commands in it, the list of tests only the instructor's checkout
runs, that unwritten exercises are skipped saying what to do, and that the processes a release
starts import the release's own ``lecture_lib``. These are the fast checks; ``make test`` (its
step ``make release-test``) runs the release's whole ``make test`` in ``build/release``.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lecture_lib.grading import release as rel
from lecture_lib.grading import stubs
from lecture_lib.grading.cli import main

ROOT = stubs.ROOT
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A release written into a temporary folder: (its folder, the released paths)."""
    out = tmp_path_factory.mktemp("release") / "course"
    return out, rel.release(out)


def _env(out):
    """The environment the release's Makefile gives its commands (PYTHONPATH: the release),
    without what an outer make (`make test`'s flags, `-i` say) would pass on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LECTURE_"))
           and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    return dict(env, PYTHONPATH=str(out), OMP_NUM_THREADS="1")


def _make(out, *args):
    return subprocess.run(["make", "--no-print-directory", "-C", str(out), *args, "SETUP=",
                           f"VENV={Path(sys.executable).parents[1]}"], capture_output=True,
                          text=True, timeout=60, env=_env(out))


def test_the_release_holds_the_course_and_not_the_answers(built):
    out, files = built
    assert not any(f.startswith(("solutions", ".ci", "tests/browser", "gradescope"))
                   for f in files)
    for gone in ("CONTRIBUTING.md", "tests/test_grading.py", "tests/test_grading_tamper.py",
                 "tests/tamper_routes.py", "tests/test_release.py", "tools/repro_widget_stall.py"):
        assert gone not in files
    for needed in ("README.md", "Makefile", "pyproject.toml", "environment.yml", "conftest.py",
                   "tools/course.py", "tools/render_notebooks.py", "tools/book.py",
                   "tests/conftest.py", "book/conf.py", "book/index.md", "book/glossary.md"):
        assert needed in files, needed
    assert sorted(f for f in files if f.startswith("tools/")) == [
        "tools/book.py", "tools/course.py", "tools/render_notebooks.py"]

    def pack(folder, pattern):
        return {str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob(pattern)
                if "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts}
    released = set(files)
    assert pack("lecture_lib", "*.py") <= released                   # the whole library
    assert pack("notebooks", "*.ipynb") <= released
    assert pack("exercises", "ex*.py") | pack("tests/exercises", "test_ex*.py") <= released
    assert pack("examples", "*.py") <= released
    # the tests left out are exactly those SKIP_TESTS names (and tests/browser/, tests/shortcuts/)
    left = {f for f in pack("tests", "*.py") - released
            if not f.startswith(("tests/browser/", "tests/shortcuts/"))}   # instructor-only folders
    assert left and all(any(Path(f).match(p) for p in rel.SKIP_TESTS) for f in left), left


def test_a_private_folder_is_left_out_even_inside_a_copied_one():
    """``release(..., private=[DIR])`` (``--private DIR``): DIR is refused wherever it sits,
    here tests/exercises/, which is otherwise copied."""
    tests = ROOT / "tests"
    names = sorted(p.name for p in tests.iterdir())
    assert "exercises" in names and "exercises" not in rel._ignore([])(str(tests), names)
    skipped = rel._ignore([tests / "exercises"])(str(tests), names)
    assert "exercises" in skipped and "conftest.py" not in skipped


def test_the_makefile_lists_the_tests_the_release_leaves_out(built):
    """What the release does not ship runs in the checkout's `make test` (INSTRUCTOR_TESTS),
    with the exercises' tests against solutions/: no test is left out of CI."""
    out, files = built
    text = (ROOT / "Makefile").read_text()
    m = re.search(r"^INSTRUCTOR_TESTS :=((?:.*\\\n)*.*)$", text, re.M)
    words = m.group(1).replace("\\\n", " ")
    listed = {w for w in re.sub(r"\$\(wildcard [^)]*\)", "", words).split()} | {
        str(p.relative_to(ROOT)) for pats in re.findall(r"\$\(wildcard ([^)]*)\)", words)
        for pat in pats.split() for p in ROOT.glob(pat)}
    left = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")} - set(files)
    assert listed == left | {"tests/exercises"}


def test_the_readme_is_for_students_and_names_nothing_absent(built):
    out, _ = built
    readme = (out / "README.md").read_text()
    headings = re.findall(r"^## (.*)$", readme, re.M)
    ours = re.findall(r"^## (.*)$", (ROOT / "README.md").read_text(), re.M)
    assert readme.startswith("# Parallelism Basics\n") and "make course" in readme[:1200]
    assert headings == [h for h in ours if not h.startswith(rel.INSTRUCTOR_SECTIONS)]
    assert len(headings) == len(ours) - 1 and "docs/" not in readme
    assert rel.absent_names(readme, out) == []
    assert "solution" not in readme.lower()
    assert "python -m lecture_lib.grading grade exercises/ex00_ring_sum.py" in readme
    assert "stub not implemented yet" in readme


def test_absent_names_finds_what_a_release_lacks(built):
    out, _ = built
    text = textwrap.dedent("""\
        Edit `exercises/exNN_*.py`, run `notebooks/<nb>.ipynb` and `tools/course.py`;
        the tests are in tests/exercises/. Worked answers: `solutions/`, the CI: .ci/run,
        and tools/repro_widget_stall.py reproduces a stall. See `lecture_lib/nowhere.py`.
        """)
    assert sorted(rel.absent_names(text, out)) == [".ci/run", "lecture_lib/nowhere.py",
                                                   "solutions/", "tools/repro_widget_stall.py"]
    assert rel.absent_names("Compare with the worked solution.", out) == [
        "solutions (the word)"]


def test_the_release_readme_leaves_out_the_instructors_section_only():
    readme = ("# Title\n\nIntro `make course`.\n\n## What you need\n\ntext\n\n"
              "## For instructors and maintainers\n\nsee docs/instructors.md\n\n## Help\n\nh\n")
    out = rel.student_readme(readme)
    assert out == "# Title\n\nIntro `make course`.\n\n## What you need\n\ntext\n\n## Help\n\nh\n"


def test_a_release_is_written_from_the_instructors_checkout_only(tmp_path, monkeypatch, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert main(["release", str(tmp_path / "full")]) == 2        # the command line's exit status
    assert "not empty" in capsys.readouterr().err
    monkeypatch.setattr(rel, "SOLUTIONS", tmp_path / "no_solutions")      # as in a release
    with pytest.raises(ValueError, match="a student's copy already"):
        rel.release(tmp_path / "new")
    assert not (tmp_path / "new").exists()


@needs_make
def test_the_release_runs_its_commands_with_what_it_holds(built):
    """`make course`, `make render` and `make test` in the release name only its own files;
    the instructor's targets there say so, and never touch exercises/."""
    out, _ = built
    for target, expect in (("course", "tools/course.py notebooks"),
                           ("render", "tools/render_notebooks.py --output-dir build/notebooks"),
                           ("test", "-p lecture_lib.grading.release -n 2 --durations=10 tests")):
        done = _make(out, "-n", target)
        assert done.returncode == 0 and expect in done.stdout, done.stdout + done.stderr
        assert "solutions" not in done.stdout
    assert "--nbval-lax" in _make(out, "-n", "test").stdout
    assert "make course" in _make(out, "help").stdout
    before = sorted(p.read_text() for p in (out / "exercises").glob("ex*.py"))
    for target in ("exercises", "release-test", "test-browser"):
        done = _make(out, target)
        assert done.returncode != 0 and "only in the instructor's checkout" in done.stdout
    assert sorted(p.read_text() for p in (out / "exercises").glob("ex*.py")) == before


def test_unwritten_lines_are_the_stubs_raises(built):
    out, _ = built
    stub, answer = out / "exercises" / "ex01_ring_allreduce.py", next(
        stubs.SOLUTIONS.glob("ex01_*.py"))
    lines = rel.unwritten(stub)
    assert len(lines) == 3 and all("NotImplementedError" in stub.read_text().splitlines()[n - 1]
                                   for n in lines)
    assert rel.unwritten(answer) == []


def test_unwritten_exercises_are_skipped_saying_what_to_do(built):
    """The release's pytest (as its `make test` runs it): the stub's tests skip, with the file to
    write and the command that grades it."""
    out, _ = built
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "lecture_lib.grading.release", "-p",
         "no:cacheprovider", "-q", "-rs", "tests/exercises/test_ex04_memory_per_device.py"],
        cwd=out, env=_env(out), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and " skipped" in done.stdout and "passed" not in done.stdout, \
        done.stdout + done.stderr
    assert "stub not implemented yet: write exercises/ex04_memory_per_device.py" in done.stdout
    assert "python -m lecture_lib.grading grade exercises/ex04_memory_per_device.py" in done.stdout
    assert "exercises not written yet: their tests were skipped" in done.stdout


def test_a_releases_processes_import_its_own_library(built):
    """With the Makefile's PYTHONPATH, the release's lecture_lib is the one imported: by the
    command, by the ranks its zygote forks, by the grader's sandboxed child and its ranks
    (this interpreter's editable install points at the checkout)."""
    out, _ = built
    script = textwrap.dedent("""\
        import json, lecture_lib
        from lecture_lib.grading import load_exercise

        def where():
            import lecture_lib
            return lecture_lib.__file__

        ex = load_exercise("ex00")
        print(json.dumps({"command": where(), "ranks": lecture_lib.run(where, 2, timeout=120),
                          "sandbox": ex.call(where),
                          "sandbox ranks": ex.run(where, 2, timeout=120)}))
        """)
    done = subprocess.run([sys.executable, "-c", script], cwd=out / "notebooks", env=_env(out),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    lib = str((out / "lecture_lib" / "__init__.py").resolve())
    assert found == {"command": lib, "ranks": [lib, lib], "sandbox": lib,
                     "sandbox ranks": [lib, lib]}, found
