"""A pipeline schedule as data: for every rank, the ordered list of its actions.

* ``F`` forward of a micro-batch through one model chunk,
* ``B`` backward (the input gradient; the whole backward unless the schedule
  also has ``W``),
* ``W`` the weight gradient, split off ``B`` by zero-bubble schedules
  (Qi et al. 2024, "Zero Bubble Pipeline Parallelism").

One :class:`Schedule` object drives both the simulator (:mod:`.simulate`) and
the executor (:mod:`.execute`); :mod:`.schedules` builds the four the course
teaches and :mod:`.validate` proves one complete and free of deadlock.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Action:
    """One unit of work on one rank: ``kind`` in F/B/W, a micro-batch, a model chunk."""
    kind: str
    microbatch: int
    chunk: int = 0

    def __str__(self):
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


@dataclass(frozen=True)
class Schedule:
    """``actions[rank]`` is the ordered list of that rank's actions.

    Rank ``r``'s chunk ``c`` is virtual stage ``c * pp + r`` (``pp`` stages) (Megatron-LM's
    interleaved layout); with one chunk, rank r is stage r.
    """
    name: str
    num_stages: int
    microbatches: int
    chunks: int
    actions: tuple = field(repr=False)

    @property
    def num_virtual_stages(self) -> int:
        return self.num_stages * self.chunks

    @property
    def split_backward(self) -> bool:
        """True when the backward is split into B (input gradient) and W (weights)."""
        return any(a.kind == "W" for acts in self.actions for a in acts)

    def stage(self, rank: int, chunk: int) -> int:
        return chunk * self.num_stages + rank

    def rank_of(self, stage: int) -> int:
        return stage % self.num_stages

    def chunk_of(self, stage: int) -> int:
        return stage // self.num_stages

    def __str__(self):
        rows = [f"rank {r}: " + " ".join(map(str, acts)) for r, acts in enumerate(self.actions)]
        return f"{self.name} (pp={self.num_stages}, m={self.microbatches}, " \
               f"v={self.chunks})\n" + "\n".join(rows)
