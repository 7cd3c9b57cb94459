"""The instructor's grader, with a trust boundary: a submission never runs where it is scored.

``python -m lecture_lib.grading grade PATH`` runs each exercise's tests in a pytest
process of its own (:mod:`.runner`); the tests reach the student's code through
:func:`load_exercise` (:mod:`.harness`), whose calls run in a sandboxed child
process with resource limits (:mod:`.sandbox`, :mod:`.procs`) and come back as
data only (:mod:`.safe_load`). The report (:mod:`.report`) is a table, JSON, or
Gradescope's ``results.json``. ``python -m lecture_lib.grading release DIR`` writes
the folder students get (:mod:`.release`), ``... stubs`` the exercise stubs
(:mod:`.stubs`); :mod:`.cli` is the command line. From a notebook,
``lecture_lib.grading.check("ex00")`` grades one exercise of ``exercises/``.

The boundary follows the autograders instructors use (Gradescope's containers,
otter-grader): the code under test runs only in processes that cannot write the
result; the process that decides pass or fail never imports, unpickles or runs
anything the submission produced.
"""
from .cli import check, main
from .harness import Exercise, assert_close_per_rank, load_exercise
from .report import gradescope, table, write_gradescope, write_json
from .runner import DEFAULT_POINTS, TESTS, Result, grade, grade_file
from .safe_load import ForbiddenValue
from .sandbox import LimitExceeded, Limits, SandboxDied

__all__ = ["load_exercise", "check", "grade", "grade_file", "main", "table", "gradescope",
           "write_json", "write_gradescope", "Result", "Exercise", "Limits", "LimitExceeded",
           "SandboxDied", "ForbiddenValue", "assert_close_per_rank", "TESTS", "DEFAULT_POINTS"]
