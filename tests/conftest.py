import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

# Close each exercise's sandbox after its test module (the grader loads it with -p too).
pytest_plugins = ["lecture_lib.grading.plugin"]
