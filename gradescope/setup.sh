#!/usr/bin/env bash
# setup.sh: Gradescope runs it once, as root, when it builds the autograder's image, with the
# zip unpacked in /autograder/source (README.md, "As a Gradescope autograder").
#
# Its paths are variables with Gradescope's defaults, so that CI (tests/test_gradescope.py)
# runs this same file under a temporary folder:
#   AUTOGRADER   the autograder's folder (default /autograder)
#   VENV         the environment the grader runs in (default /opt/venv); every user must be able
#                to read it (the sandbox runs each submission as a user of its own), so not under
#                /root. An existing one is kept, and torch is installed only if it lacks it.
#   TORCH        the torch to install (default torch==2.13.0, from PyTorch's CPU index)
#   PIP_OPTIONS  extra options for the library's install (CI: offline, from a local wheel)
set -euo pipefail
AUTOGRADER=${AUTOGRADER:-/autograder}
VENV=${VENV:-/opt/venv}
TORCH=${TORCH:-torch==2.13.0}
SOURCE=$AUTOGRADER/source

if [ ! -x "$VENV/bin/python" ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-pip python3-venv
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --upgrade pip
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/python" -m pip install "$TORCH" --index-url https://download.pytorch.org/whl/cpu
fi
# The library, and pytest: the grader runs each exercise's tests with it (the extra "grader").
# shellcheck disable=SC2086  # PIP_OPTIONS is a list of options
"$VENV/bin/python" -m pip install ${PIP_OPTIONS:-} -e "$SOURCE[grader]"
# Fail here, when the image is built, rather than score every submission 0.
"$VENV/bin/python" -c "import pytest, torch, lecture_lib.grading"

# The separate-user sandbox: the interpreter and the library readable by every user; the
# private tests by root only (the grader sends the tests' functions to the sandbox by value).
chmod o+x "$AUTOGRADER" "$SOURCE"
chmod -R o+rX "$VENV" "$SOURCE/lecture_lib"
if [ -d "$SOURCE/private_tests" ]; then
    chmod -R go-rwx "$SOURCE/private_tests"
fi
echo "setup.sh: the grader is ready in $VENV"
