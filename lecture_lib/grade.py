"""``python -m lecture_lib.grade PATH``: see :mod:`lecture_lib.grading`."""
import sys

from .grading import main

if __name__ == "__main__":
    sys.exit(main())
