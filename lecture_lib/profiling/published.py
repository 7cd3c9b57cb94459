"""A published GPU trace to read with the course's tools: ResNet-50 under PyTorch's DDP on 2
NVIDIA A100s, rank 0, three steps recorded by ``torch.profiler`` (Holistic Trace Analysis's test
data; ``traces/NOTICE.md`` says what the excerpt keeps, and the licence).

:func:`resnet50_ddp` reads it as :func:`~.profiler.profile_run` reads a trace of the course's
own runs: a :class:`~.trace.RankProfile` of the GPU's events, plus what the profile does not
keep: the host's phases and the NCCL kernels' collectives with their element counts.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from .events import read_trace
from .trace import RankProfile, shares

RESNET50_DDP = Path(__file__).with_name("traces") / "resnet50_ddp_2xA100_rank0.json.gz"
SOURCE = ("torch.profiler trace of ResNet-50 under DDP, rank 0 of 2 NVIDIA A100s, NCCL 2.17.1; "
          "from Holistic Trace Analysis's test data (facebookresearch/HolisticTraceAnalysis)")
_PHASES = {"## forward ##": "forward", "## backward ##": "backward", "## optimizer ##": "optimizer"}


@dataclass
class PublishedTrace:
    """A published trace: the GPU's profile and what the host marked."""
    profile: RankProfile          # the GPU's kernels, copies and collectives; shares of a step
    phases: list                  # the host's ("forward" | "backward" | "optimizer", start, end)
    collectives: list             # per NCCL kernel: kind ("allreduce", ...), start, end, elements
    source: str


def resnet50_ddp() -> PublishedTrace:
    """The ResNet-50 DDP trace; times in seconds from its first recorded step."""
    with gzip.open(RESNET50_DDP, "rt") as f:
        trace = json.load(f)
    events, steps = read_trace(trace)
    raw = trace["traceEvents"]
    t0 = min(e["ts"] for e in raw if e["name"].startswith("ProfilerStep#"))
    seconds = lambda e: ((e["ts"] - t0) * 1e-6, (e["ts"] + e["dur"] - t0) * 1e-6)   # noqa: E731
    phases = sorted(((_PHASES[e["name"]], *seconds(e)) for e in raw if e["name"] in _PHASES),
                    key=lambda p: p[1])
    collectives = sorted(({"kind": e["args"]["Collective name"], "start": seconds(e)[0],
                           "end": seconds(e)[1], "elements": e["args"]["In msg nelems"]}
                          for e in raw if "Collective name" in e.get("args", {})),
                         key=lambda c: c["start"])
    comm, busy = shares(events, steps)
    profile = RankProfile(rank=0, steps=steps, events=events, comm_share=comm, busy_share=busy,
                          table="", trace_path=str(RESNET50_DDP))
    return PublishedTrace(profile, phases, collectives, SOURCE)
