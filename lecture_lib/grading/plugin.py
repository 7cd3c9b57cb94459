"""A pytest plugin: close every exercise's sandbox after its test module, and before the
session's reports are written (so no process a submission started outlives its tests).

Loaded by ``tests/conftest.py`` and by the grader (``-p lecture_lib.grading.plugin``).
"""
import pytest

from .sandbox import close_all


def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        close_all()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    close_all()
