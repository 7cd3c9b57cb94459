"""Hangs: a rank that skips or reorders a collective leaves the others waiting forever.

``lecture_lib.run(..., timeout=...)`` turns the hang into
:class:`lecture_lib.RankTimeout` with every rank's stack (dumped with
``faulthandler``); :func:`hang_report` says, per rank, where it was, and
:func:`short_paths` shortens the stacks' file names for reading.
:func:`skipped_collective` plants such a hang.
"""
from __future__ import annotations

import os
import re

import torch
import torch.distributed as dist

from ..runtime import RankTimeout


def skipped_collective(skip_rank: int = 1, numel: int = 4) -> str:
    """A rank function with a planted hang: every rank but ``skip_rank`` all-reduces.

    The others wait in ``all_reduce`` for a partner that never comes; run it with
    ``lecture_lib.run(skipped_collective, n, timeout=small)`` to see the launcher
    turn the hang into :class:`lecture_lib.RankTimeout`.
    """
    x = torch.ones(numel)
    if dist.get_rank() != skip_rank:
        dist.all_reduce(x)                    # the skipping rank never joins this one
    return "returned"


def hang_report(error) -> dict[int, str]:
    """Per rank, where it was when a :class:`lecture_lib.RankTimeout` ended the call.

    A stuck rank's entry is the innermost frame of its stack (file:line in
    function); a rank that had finished says so.
    """
    if not isinstance(error, RankTimeout):
        raise TypeError(f"expected a RankTimeout, not {type(error).__name__}")
    report = {}
    for rank, stack in sorted(error.stacks.items()):
        if stack.startswith("finished"):
            report[rank] = "finished (returned from the function)"
            continue
        frames = [ln.strip() for ln in stack.splitlines() if ln.strip().startswith("File ")]
        report[rank] = "stuck at " + (frames[0] if frames else stack.strip()[:200])
    return report


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def short_paths(text: str) -> str:
    """``text`` with the course's files named from its root and installed packages' from
    their package (``"torch/distributed/..."``), as a stack is easier read."""
    text = text.replace(_ROOT + os.sep, "")
    return re.sub(r'"[^"]*(?:site|dist)-packages/', '"', text)
