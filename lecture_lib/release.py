"""``python -m lecture_lib.release DIR``: see :mod:`lecture_lib.grading.release`."""
import sys

from .grading.release import main, release

__all__ = ["main", "release"]

if __name__ == "__main__":
    sys.exit(main())
