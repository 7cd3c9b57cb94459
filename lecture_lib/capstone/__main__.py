"""``python -m lecture_lib.capstone compare A.json B.json ...`` (:mod:`.compare`)."""
import sys

from .compare import main

COMMANDS = {"compare": main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m lecture_lib.capstone {{{','.join(COMMANDS)}}} ...")
    COMMANDS[sys.argv[1]](sys.argv[2:])
