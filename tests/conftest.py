import os

os.environ.setdefault("OMP_NUM_THREADS", "1")       # before torch is imported

# The grader's plugin (it loads it with -p lecture_lib.grading.plugin too): each exercise
# test's weight marker, and each exercise's sandbox closed after its test module.
from lecture_lib.grading.plugin import (  # noqa: E402, F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_teardown,
    pytest_sessionfinish,
)
