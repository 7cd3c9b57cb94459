import os

os.environ.setdefault("OMP_NUM_THREADS", "1")       # before torch is imported

# Close each exercise's sandbox after its test module (the grader loads them with
# -p lecture_lib.grading.plugin too).
from lecture_lib.grading.plugin import (  # noqa: E402, F401
    pytest_runtest_teardown,
    pytest_sessionfinish,
)
