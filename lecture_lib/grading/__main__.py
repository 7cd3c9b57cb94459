"""``python -m lecture_lib.grading COMMAND``: see :mod:`lecture_lib.grading.cli`."""
import sys

from .cli import main

sys.exit(main())
