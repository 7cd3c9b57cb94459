"""A run described twice over: its layout (how many ranks on each axis) and its recipe.

torchtitan keeps one ``ParallelDims`` as the single source of truth for a run's layout,
and the training recipe (micro-batches, schedule, ...) in its job config; so does the
course:

* :class:`ParallelDims`, the **layout**: the size of every axis, always present (1 when
  unused): ``dp`` (data), ``tp`` (tensor), ``pp`` (pipeline), ``cp`` (context: the
  sequence split over ranks) and ``ep`` (experts, carved out of the ``dp`` ranks as in
  Megatron-Core, so it adds no ranks). A run has ``dp * pp * cp * tp`` ranks::

        dp=2, pp=2, cp=1, tp=2: 8 ranks, tp fastest (its groups stay inside a node)

              pp=0      pp=1
        dp=0  [0 1]  -> [2 3]       [0 1] a tp group, 0 -> 2 a pipeline,
        dp=1  [4 5]  -> [6 7]       0 and 4 a dp group (the same weights)

* :class:`Recipe`, **how a step is run** on that layout: the micro-batches per pipeline
  (``microbatches``) and/or a micro-batch's size in sequences (``microbatch_size``; give
  either, or both when they agree: :meth:`Recipe.split` derives the other from a batch),
  the pipeline ``schedule``, the ZeRO stage (``zero_stage``, 0-3: Rajbhandari et al.
  2020), and context parallelism's slices (``cp_layout``) and method (``cp_method``).

Each checks its own fields when made, each failure a ``ValueError`` that starts with what
it is about ("parallel layout dp2 tp2 ...", "recipe m4 zero1 ..."). The rank grid is built
from the layout (:meth:`lecture_lib.mesh.RankGrid.from_dims`); :func:`lecture_lib.hybrid.
parallelize` applies both to a GPT; the cost model takes both
(:class:`lecture_lib.costmodel.steptime.Parallelism`). This module imports nothing of the
library, so every layer can use it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

AXES = ("dp", "pp", "cp", "tp")
"""The grid's axes, slowest to fastest (tp last: its group stays inside a node)."""
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class ParallelDims:
    """A run's layout: the size of every axis (ep is carved out of dp)."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        problems = [_whole(a, getattr(self, a)) for a in ("dp", "tp", "pp", "cp", "ep")]
        problems = [p for p in problems if p]
        if not problems and self.dp % self.ep:
            problems.append(f"ep={self.ep} must divide dp={self.dp} (experts shard over dp)")
        if problems:
            raise ValueError(f"parallel layout {self.label()}: {'; '.join(problems)}")

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes().values())

    def sizes(self) -> dict[str, int]:
        """``{"dp", "pp", "cp", "tp"}`` in :data:`AXES` order, every axis present."""
        return {a: getattr(self, a) for a in AXES}

    def label(self) -> str:
        """``dp2 tp2 pp1 cp1``, and ``ep4`` when experts are split."""
        parts = [f"{a}{getattr(self, a)}" for a in ("dp", "tp", "pp", "cp")]
        return " ".join(parts + ([f"ep{self.ep}"] if self.ep != 1 else []))

    def check(self, world_size: int) -> None:
        """A clear error unless this layout has exactly ``world_size`` ranks."""
        if self.world_size != world_size:
            grid = " x ".join(f"{a}={s}" for a, s in self.sizes().items())
            raise ValueError(f"parallel layout {self.label()}: grid {grid} has "
                             f"{self.world_size} ranks but world_size is {world_size}")


@dataclass(frozen=True)
class Recipe:
    """How a step runs on a layout: its micro-batches, schedule, ZeRO stage, cp's method."""
    microbatches: int | None = None       # per pipeline and step; None: from microbatch_size
    microbatch_size: int | None = None    # sequences per micro-batch; None: from microbatches
    schedule: str = "1f1b"
    zero_stage: int = 0
    cp_layout: str = "zigzag"             # cp's slices of the sequence (context_parallel.layout)
    cp_method: str = "ring"               # "ring" or "ulysses"

    def __post_init__(self):
        problems = [_whole(a, getattr(self, a)) for a in ("microbatches", "microbatch_size")
                    if getattr(self, a) is not None]
        if self.zero_stage not in ZERO_STAGES or isinstance(self.zero_stage, bool):
            problems.append(f"zero_stage must be one of {ZERO_STAGES}, not {self.zero_stage!r}")
        problems += [f"{name} must be a name, not {getattr(self, name)!r}"
                     for name in ("schedule", "cp_layout", "cp_method")
                     if not isinstance(getattr(self, name), str)]
        problems = [p for p in problems if p]
        if problems:
            self._fail("; ".join(problems))

    def label(self) -> str:
        """``m4 zero1``: what is not the default ("" when nothing is)."""
        parts = [f"m{self.microbatches}"] if self.microbatches is not None else []
        parts += [f"mb{self.microbatch_size}"] if self.microbatch_size is not None else []
        parts += [f"zero{self.zero_stage}"] if self.zero_stage else []
        parts += [str(self.schedule)] if self.schedule != "1f1b" else []
        parts += [f"cp:{self.cp_method}/{self.cp_layout}"] if (
            self.cp_method, self.cp_layout) != ("ring", "zigzag") else []
        return " ".join(parts)

    def split(self, global_batch: int, dp: int = 1) -> tuple[int, int]:
        """``(microbatches, microbatch_size)`` of a step of ``global_batch`` sequences on
        ``dp`` replicas: the batch over the replicas, then over the micro-batches; a clear
        error when it does not divide, or when the two given numbers disagree."""
        if problem := _whole("global batch", global_batch):
            self._fail(problem)
        m, b = self.microbatches, self.microbatch_size
        if b is not None and global_batch % (dp * b):
            self._fail(f"global batch {global_batch} is not a whole number of micro-batches "
                       f"of {b} on {dp} data-parallel replicas")
        replica, rest = divmod(global_batch, dp)
        if rest:
            self._fail(f"a batch of {global_batch} does not split over dp={dp} replicas")
        if b is not None:
            if m is not None and m != replica // b:
                self._fail(f"{m} micro-batches of {b} are not the {replica} sequences "
                           f"of a replica")
            return replica // b, b
        m = m or 1
        if replica % m:
            self._fail(f"a replica's batch of {replica} does not divide into {m} micro-batches")
        return m, replica // m

    def _fail(self, message: str):
        raise ValueError(f"recipe {self.label() or '(the default)'}: {message}")


def _whole(name: str, value, minimum: int = 1) -> str | None:
    """A complaint unless ``value`` is a whole number >= ``minimum`` (None when fine)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return f"{name} must be a whole number >= {minimum}, not {value!r}"
    return None
