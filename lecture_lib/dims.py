"""A parallel layout, described once: how many ranks along each axis, and how a step is cut.

torchtitan keeps one ``ParallelDims`` as the single source of truth for a
run's layout; so does the course. A :class:`ParallelDims` names

* the size of every axis, always present (1 when unused): ``dp`` (data), ``tp``
  (tensor), ``pp`` (pipeline), ``cp`` (context: the sequence split over ranks) and
  ``ep`` (experts, carved out of the ``dp`` ranks as in Megatron-Core, so it does
  not add ranks); the ranks of a run are ``dp * pp * cp * tp``;
* how a step is cut: the number of micro-batches per pipeline (``microbatches``)
  and/or a micro-batch's size in sequences (``microbatch_size``): give either, or
  both when they agree; :meth:`ParallelDims.split` derives the other from a batch;
* the pipeline ``schedule``, the ZeRO stage (``zero_stage``, 0-3: Rajbhandari et al.
  2020), and context parallelism's slices (``cp_layout``) and method (``cp_method``).

It checks its own fields when made, and a world size with :meth:`ParallelDims.check`,
each failure a ``ValueError`` that starts with the layout it is about. The rank grid
is built from it by :meth:`lecture_lib.mesh.RankGrid.from_dims`, the cost model takes it
(:class:`lecture_lib.costmodel.steptime.Parallelism`), and
:func:`lecture_lib.hybrid.parallelize` applies it to a GPT. This module imports
nothing of the library, so every layer can use it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

AXES = ("dp", "pp", "cp", "tp")
"""The grid's axes, slowest to fastest (tp last: its group stays inside a node)."""
ZERO_STAGES = (0, 1, 2, 3)


def _whole(name: str, value, minimum: int = 1) -> str | None:
    """A complaint unless ``value`` is a whole number >= ``minimum`` (None when fine)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return f"{name} must be a whole number >= {minimum}, not {value!r}"
    return None


@dataclass(frozen=True)
class ParallelDims:
    """A run's layout: every axis, the micro-batching, the schedule, ZeRO, cp's method."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    microbatches: int | None = None       # per pipeline and step; None: from microbatch_size
    microbatch_size: int | None = None    # sequences per micro-batch; None: from microbatches
    schedule: str = "1f1b"
    zero_stage: int = 0
    cp_layout: str = "zigzag"             # cp's slices of the sequence (context_parallel.layout)
    cp_method: str = "ring"               # "ring" or "ulysses"

    def __post_init__(self):
        problems = [_whole(a, getattr(self, a)) for a in ("dp", "tp", "pp", "cp", "ep")]
        problems += [_whole(a, getattr(self, a)) for a in ("microbatches", "microbatch_size")
                     if getattr(self, a) is not None]
        if self.zero_stage not in ZERO_STAGES or isinstance(self.zero_stage, bool):
            problems.append(f"zero_stage must be one of {ZERO_STAGES}, not {self.zero_stage!r}")
        for name in ("schedule", "cp_layout", "cp_method"):
            if not isinstance(getattr(self, name), str):
                problems.append(f"{name} must be a name, not {getattr(self, name)!r}")
        problems = [p for p in problems if p]
        if not problems and self.dp % self.ep:
            problems.append(f"ep={self.ep} must divide dp={self.dp} (experts shard over dp)")
        if problems:
            self._fail("; ".join(problems))

    def _fail(self, message: str):
        raise ValueError(f"parallel layout {self.label()}: {message}")

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes().values())

    def sizes(self) -> dict[str, int]:
        """``{"dp", "pp", "cp", "tp"}`` in :data:`AXES` order, every axis present."""
        return {a: getattr(self, a) for a in AXES}

    def label(self) -> str:
        """``dp2 tp2 pp1 cp1`` and whatever else is not the default."""
        parts = [f"{a}{getattr(self, a)}" for a in ("dp", "tp", "pp", "cp")]
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"m{self.microbatches}"] if self.microbatches is not None else []
        parts += [f"mb{self.microbatch_size}"] if self.microbatch_size is not None else []
        parts += [f"zero{self.zero_stage}"] if self.zero_stage else []
        return " ".join(parts)

    def check(self, world_size: int) -> None:
        """A clear error unless this layout has exactly ``world_size`` ranks."""
        if self.world_size != world_size:
            self._fail(f"grid {' x '.join(f'{a}={s}' for a, s in self.sizes().items())} "
                       f"has {self.world_size} ranks but world_size is {world_size}")

    def split(self, global_batch: int) -> tuple[int, int]:
        """``(microbatches, microbatch_size)`` of a step of ``global_batch`` sequences: the
        batch over the dp replicas, then over the micro-batches; a clear error when it does
        not divide, or when the two given numbers disagree."""
        if problem := _whole("global batch", global_batch):
            self._fail(problem)
        m, b = self.microbatches, self.microbatch_size
        if b is not None and global_batch % (self.dp * b):
            self._fail(f"global batch {global_batch} is not a whole number of micro-batches "
                       f"of {b} on {self.dp} data-parallel replicas")
        replica, rest = divmod(global_batch, self.dp)
        if rest:
            self._fail(f"a batch of {global_batch} does not split over dp={self.dp} replicas")
        if b is not None:
            if m is not None and m != replica // b:
                self._fail(f"{m} micro-batches of {b} are not the {replica} sequences "
                           f"of a replica")
            return replica // b, b
        m = m or 1
        if replica % m:
            self._fail(f"a replica's batch of {replica} does not divide into {m} micro-batches")
        return m, replica // m
