"""What an exercise test calls: the student's code, behind the trust boundary.

``ex = load_exercise("ex00")`` gives the test an :class:`Exercise`. The test
reads as before, and the student's module is never imported into the test's
process (the one that decides pass or fail):

* ``ex.ring_sum(x)``: the call runs in the exercise's sandboxed child and its
  return value comes back as data (:mod:`.safe_load`); an exception comes back
  as the same built-in type (``pytest.raises(ValueError)`` works) with the
  submission's traceback attached as a note;
* ``ex.run(fn, world_size, *args, timeout=60)``: ``lecture_lib.run`` started
  *inside* the child, so ``fn`` (the test's own rank function) runs on ranks
  that the child starts, where ``ex`` is the student's real module; the
  results by rank come back as data; ``RankError``/``RankTimeout`` come back
  as themselves (with every stuck rank's stack);
* ``ex.call(fn, *args)``: the test's own ``fn`` run once in the child (to
  batch many cheap calls into one round trip).

Inside the child and its ranks, ``load_exercise`` returns the student's module
(seen through :class:`Submission`, which marks every call into it as the
submission's), so a rank function written for the old harness runs unchanged.
Each exercise has one child (restarted after a call breaks it), closed after its
test module by the pytest plugin :mod:`.plugin`.

Calling the library's answer earns nothing (DESIGN.md, principle 9): for each
exercise :data:`.answers.ANSWERS` names what it asks for and the library's
functions and classes that are it; in the child and on its ranks they refuse the
submission (:func:`.refusal.refuse`), and the test fails with
:class:`AnswerRefused`, whose message says which call and why.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import cloudpickle

from ..runtime import launch
from .answers import ANSWERS, Answer, submission
from .probes import _short, assert_close_per_rank, difference, record_dist  # noqa: F401  TODO(lead): tests import from probes
from .safe_load import ForbiddenValue
from .sandbox import LimitExceeded, Limits, Sandbox, SandboxDied, close_all
from .stubs import EXERCISES, ROOT, SOLUTIONS, exercise_id

__all__ = ["load_exercise", "Exercise", "Limits", "LimitExceeded", "SandboxDied",
           "ForbiddenValue", "AnswerRefused", "ANSWERS", "Answer", "close_all",
           "assert_close_per_rank", "difference", "record_dist"]

#: Exception types a submission's exception comes back as (else SubmissionError).
_TYPES = {c.__name__: c for c in (
    NotImplementedError, ValueError, TypeError, IndexError, KeyError, LookupError,
    ZeroDivisionError, ArithmeticError, AttributeError, AssertionError, RuntimeError,
    PermissionError, FileNotFoundError, OSError)}
_OPEN: dict[tuple, "Exercise"] = {}


class AnswerRefused(AssertionError):
    """The submission called its exercise's answer in the library (the message says which)."""


class SubmissionError(Exception):
    """An exception of another type, raised by the submission (its type name is kept)."""


def student_file(ex: str) -> Path:
    """The file under test for ``ex``: ``$LECTURE_EXERCISE_PATH`` if it is that exercise's,
    else ``exNN_*.py`` in ``$LECTURE_EXERCISE_DIR`` (default solutions/, or exercises/ in a
    student release, which has no solutions)."""
    path = os.environ.get("LECTURE_EXERCISE_PATH")
    if path and exercise_id(path) == ex:
        return Path(path)
    default = SOLUTIONS if SOLUTIONS.is_dir() else EXERCISES
    folder = Path(os.environ.get("LECTURE_EXERCISE_DIR", default))
    matches = sorted(folder.glob(f"{ex}_*.py"))
    if not matches:
        raise FileNotFoundError(f"no file {ex}_*.py in {folder}")
    return matches[0]


def load_exercise(ex: str, **limits):
    """The code under test for exercise ``ex`` ('ex00'), behind the trust boundary.

    ``limits`` override :class:`Limits` for this exercise (``memory_gib=2``, ...).
    In the sandboxed child and its ranks, the student's module itself.
    """
    if os.environ.get("LECTURE_SANDBOX_EXERCISE") == ex:
        return submission(ex)
    key = (ex, tuple(sorted(limits.items())))
    if key not in _OPEN:
        _OPEN[key] = Exercise(ex, student_file(ex), Limits(**limits))
    return _OPEN[key]


class Exercise:
    """The student's module for one exercise, as the grading test sees it."""

    def __init__(self, name: str, path: Path, limits: Limits):
        self.name, self.path, self.limits = name, Path(path), limits
        self._sandbox = Sandbox(name, self.path, limits)

    def __getattr__(self, attr: str):
        if attr.startswith("_"):              # pytest and pickle probe private names
            raise AttributeError(attr)
        return _Remote(self, attr)

    def attr(self, name: str):
        """The student's ``name`` when it is one of ours (``run``, ``call``, ``close``...)."""
        return _Remote(self, name)

    def __reduce__(self):                 # sent into the child: the real module there
        return (load_exercise, (self.name,))

    def __repr__(self):
        return f"<exercise {self.name}: {self.path}, run in a sandbox>"

    def run(self, fn, world_size: int, *args, timeout: float = 60, **kwargs) -> list:
        """``lecture_lib.run(fn, world_size, *args, timeout=timeout)`` inside the sandbox."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        return self._call(_run_ranks, (fn, world_size, args, kwargs, timeout),
                          wall=timeout + self.limits.wall_s)

    def call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` once inside the sandbox (``ex`` is the real module there)."""
        return self._call(fn, args, kwargs, wall=self.limits.wall_s)

    def close(self) -> None:
        self._sandbox.close()

    def _call(self, fn, args=(), kwargs=None, wall: float = 120.0):
        payload = _dumps((fn, tuple(args), dict(kwargs or {})))
        reply = self._sandbox.call(payload, wall)
        if reply["ok"]:
            return reply.get("value")
        raise self._exception(reply.get("error"))

    def _exception(self, data) -> BaseException:
        if type(data) is not dict:
            return ForbiddenValue(f"{self.name}: the submission's process sent a malformed error")
        text = str(data.get("message", ""))
        tb = str(data.get("traceback", ""))
        types = [t for t in data.get("types", []) if isinstance(t, str)]
        limit = self.limits.describe(f"{types[:1]} {text} {data.get('rank_traceback', '')}",
                                     self.name)
        if limit:
            return LimitExceeded(limit)
        refused = _refused(types, text, str(data.get("rank_traceback", "")), data.get("rank"))
        if refused:
            return AnswerRefused(refused)
        if "ForbiddenValue" in types[:1]:
            return ForbiddenValue(f"{self.name}: {text}")
        if "RankError" in types:
            cls = launch.RankTimeout if "RankTimeout" in types else launch.RankError
            exc = cls.__new__(cls)
            Exception.__init__(exc, text)
            exc.rank, exc.traceback = data.get("rank", 0), str(data.get("rank_traceback", ""))
            exc.stacks = dict(data.get("stacks") or {})
            return exc
        cls = next((_TYPES[t] for t in types if t in _TYPES), SubmissionError)
        note = f"--- raised in the submission ({self.name}) ---\n{tb.rstrip()}"
        if cls is SubmissionError:
            text = f"{types[0] if types else 'Exception'}: {text}"
        if hasattr(BaseException, "add_note"):          # Python 3.11+
            exc = cls(text)
            exc.add_note(note)
        else:
            exc = cls(f"{text}\n{note}")
        return exc


def _refused(types: list, text: str, rank_traceback: str, rank) -> str | None:
    """The refusal's own line, where the submission called its exercise's answer."""
    if "LibraryAnswerRefused" in types[:1]:
        return text.strip().splitlines()[0] if text.strip() else "refused"
    marker = "LibraryAnswerRefused: "
    lines = [ln for ln in rank_traceback.splitlines() if marker in ln]
    if "RankError" in types and lines:
        return f"{lines[-1].split(marker, 1)[1].strip()} (rank {rank})"
    return None


class _Remote:
    """``ex.name``: calling it calls the student's ``name`` in the sandbox."""

    def __init__(self, exercise: Exercise, attr: str):
        self.exercise, self.attr = exercise, attr

    def __call__(self, *args, **kwargs):
        return self.exercise._call(_call_attr, (self.exercise.name, self.attr, args, kwargs),
                                   wall=self.exercise.limits.wall_s)

    def __reduce__(self):                 # sent into the child: the real attribute there
        return (_attr_in_child, (self.exercise.name, self.attr))

    def __repr__(self):
        return f"<{self.exercise.name}.{self.attr}, run in a sandbox>"


def _attr_in_child(ex: str, attr: str):
    return getattr(load_exercise(ex), attr)


def _call_attr(ex: str, attr: str, args, kwargs):
    return getattr(load_exercise(ex), attr)(*args, **kwargs)


def _run_ranks(fn, world_size, args, kwargs, timeout):
    return launch.run(fn, world_size, *args, timeout=timeout, **kwargs)


def _dumps(request) -> bytes:
    """Pickle a request; the test modules' own functions go by value (the child need not be
    able to import, or even read, the test files)."""
    pack = str(ROOT / "lecture_lib")
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if Path(path).name.startswith("test_") and not path.startswith(pack):
            try:
                cloudpickle.register_pickle_by_value(module)
            except ValueError:
                pass
    return cloudpickle.dumps(request)
