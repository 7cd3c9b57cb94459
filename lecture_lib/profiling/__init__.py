"""Profiling distributed training: where does a step's time go, on every rank?

A slow distributed job is slow for one of a few reasons, and a profiler trace
tells them apart (PyTorch profiler recipe; HTA, "Holistic Trace Analysis",
Meta 2023; the Ultra-Scale Playbook's profiling chapter): communication takes
a large share of the step, or the device is idle much of it.

* :mod:`.events`: reading a ``torch.profiler`` trace into events, what is
  communication and what is work, the collectives it ran (:func:`read_trace`,
  :func:`comm_intervals`, :func:`comm_kinds`);
* :mod:`.trace`: what one rank's profile says: the shares of a step, the overlap,
  a timeline (:class:`RankProfile`, :func:`shares`, :func:`timeline`).
* :mod:`.profiler`: running a step under the profiler on N ranks
  (:func:`profile_steps`, :func:`profile_run`).
* :mod:`.emulated`: the same profile in emulated time, read from the
  emulation's streams (:func:`profile_steps_emulated`, or ``profile_run(...,
  emulate="h100-node")``).
* :mod:`.published`: a published GPU trace to read (ResNet-50 under DDP on 2 A100s,
  :func:`~.published.resnet50_ddp`).
* :mod:`.diagnose`: the rules of thumb, with advice that depends on the
  communication the run did (:func:`diagnose`, :func:`diagnose_run`).
* :mod:`.experiments`: the course's own schemes as steps to profile
  (:func:`data_parallel_step`, :func:`pipeline_step`).
"""
from .diagnose import BUSY_SHARE_LIMIT, COMM_SHARE_LIMIT, Diagnosis, diagnose, diagnose_run
from .emulated import profile_steps_emulated
from .events import (
                     COMM_PATTERN,
                     PHASE_PREFIX,
                     Event,
                     classify,
                     comm_intervals,
                     comm_kinds,
                     covered,
                     merge,
                     read_trace,
)
from .experiments import SYNCS, data_parallel_step, pipeline_step
from .profiler import TracedTimer, profile_run, profile_steps
from .trace import RankProfile, StepShares, exposed_share, overlap_share, shares, timeline

__all__ = ["BUSY_SHARE_LIMIT", "COMM_PATTERN", "COMM_SHARE_LIMIT", "PHASE_PREFIX", "SYNCS",
           "Diagnosis", "Event", "RankProfile", "StepShares", "TracedTimer", "classify",
           "comm_intervals", "comm_kinds", "covered", "data_parallel_step", "diagnose",
           "diagnose_run", "exposed_share", "merge", "overlap_share", "pipeline_step",
           "profile_run", "profile_steps", "profile_steps_emulated", "read_trace", "shares",
           "timeline"]
