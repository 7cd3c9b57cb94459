"""A pytest plugin for exercise tests: each test's weight, and no process left behind.

* ``@pytest.mark.weight(n)`` gives a test ``n`` shares of its exercise's points (default 1),
  so the tests of what an exercise is about can carry most of them. The weight travels to the
  grader in the JUnit report (a ``weight`` property of the test case).
* Every exercise's sandbox is closed after its test module, and before the session's reports
  are written (so no process a submission started outlives its tests).

Loaded by ``tests/conftest.py`` and by the grader (``-p lecture_lib.grading.plugin``).
"""
import pytest

from .sandbox import close_all


def pytest_configure(config):
    config.addinivalue_line("markers", "weight(n): this test's share of its exercise's points "
                            "(default 1)")


def weight_of(item) -> float:
    """The weight of a collected test: its ``weight`` marker's argument, else 1."""
    marker = item.get_closest_marker("weight")
    if marker is None:
        return 1.0
    (value,) = marker.args
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise pytest.UsageError(f"{item.nodeid}: weight must be a positive number, not {value!r}")
    return float(value)


def pytest_collection_modifyitems(items):
    for item in items:                # once, though conftest.py and -p may both load us
        if not any(name == "weight" for name, _ in item.user_properties):
            item.user_properties.append(("weight", weight_of(item)))


def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        close_all()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    close_all()
