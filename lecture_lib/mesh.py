"""The rank grid: which rank does what along each parallel dimension.

With ``world_size = dp * pp * cp * tp`` ranks, each rank has one coordinate per
named dimension. Ranks are laid out row-major with the *last* dimension
fastest, so ``RankGrid(dp=2, tp=2)`` puts ranks {0, 1} in one tensor-parallel
group: the last dimension is the one to keep inside a node (fast links), as
Megatron-LM does with tensor parallelism.

:func:`grid_coordinates` and :func:`grid_groups` are pure arithmetic (usable
before any process starts, to check and to draw a configuration);
:class:`RankGrid` builds the real process groups on torch's ``DeviceMesh``.

The context-parallel axis ``cp`` (the sequence split over ranks,
:mod:`lecture_lib.context_parallel`) goes just outside ``tp``: ring attention's
K/V sends are the heaviest traffic after tensor parallelism's (Megatron-Core
orders its groups tp, cp, ..., dp, pp from fastest). A run's grid comes from its
layout, :meth:`RankGrid.from_dims` of a :class:`lecture_lib.dims.ParallelDims`,
and has every axis (size 1 when unused). A grid named by hand may leave ``cp``
out: :func:`grid_groups` and :class:`RankGrid` answer for it as for a dimension
of size one.
"""
from __future__ import annotations

import math

import torch.distributed as dist

from .comm import LOCAL
from .dims import AXES, ParallelDims

ORDER = AXES
"""The course's grid order, slowest to fastest (the last stays inside a node)."""
DEFAULT_ONE = ("cp",)
"""Dimensions a grid may leave out: absent, they have size 1."""


def check_grid(world_size: int, dims: dict[str, int]) -> None:
    """Clear error unless every size is a positive int and their product is ``world_size``."""
    if not dims:
        raise ValueError("a grid needs at least one named dimension, e.g. dp=4")
    for name, size in dims.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"grid dimension {name}={size!r} must be a whole number >= 1")
    product = math.prod(dims.values())
    if product != world_size:
        shape = " x ".join(f"{n}={s}" for n, s in dims.items())
        raise ValueError(f"grid {shape} has {product} ranks but world_size is {world_size}")


def grid_coordinates(rank: int, dims: dict[str, int]) -> dict[str, int]:
    """``rank``'s coordinate along each dimension (last dimension fastest)."""
    coords = {}
    for name, size in reversed(list(dims.items())):
        coords[name] = rank % size
        rank //= size
    return dict(reversed(list(coords.items())))


def grid_groups(dims: dict[str, int], name: str) -> list[list[int]]:
    """Every group of ranks that differ only along dimension ``name``."""
    if name in DEFAULT_ONE and name not in dims:
        return [[rank] for rank in range(math.prod(dims.values()))]
    if name not in dims:
        raise KeyError(f"no dimension {name!r} in grid {dims}")
    world = math.prod(dims.values())
    groups: dict[tuple, list[int]] = {}
    for rank in range(world):
        c = grid_coordinates(rank, dims)
        key = tuple(v for k, v in c.items() if k != name)
        groups.setdefault(key, []).append(rank)
    return list(groups.values())


class RankGrid:
    """The process groups of a named grid, e.g. ``RankGrid(dp=2, tp=2)`` inside a rank.

    ``grid.coord("tp")`` is this rank's coordinate, ``grid.size("tp")`` the
    dimension's size, ``grid.group("tp")`` its process group (for collectives)
    and ``grid.mesh`` the underlying ``DeviceMesh``.
    """

    def __init__(self, device_type: str | None = None, **dims: int):
        from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415  (only ranks need it)
        world_size = dist.get_world_size()
        check_grid(world_size, dims)
        if device_type is None:
            device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
        self.dims = dict(dims)
        self.rank = dist.get_rank()
        self.mesh = init_device_mesh(device_type, tuple(dims.values()),
                                     mesh_dim_names=tuple(dims))
        self.coords = grid_coordinates(self.rank, self.dims)

    @classmethod
    def from_dims(cls, dims: ParallelDims, device_type: str | None = None) -> RankGrid:
        """The grid of a layout: every axis of :data:`ORDER`, tp fastest."""
        dims.check(dist.get_world_size())
        return cls(device_type, **dims.sizes())

    def _absent(self, name: str) -> bool:
        return name in DEFAULT_ONE and name not in self.dims

    def coord(self, name: str) -> int:
        return 0 if self._absent(name) else self.coords[name]

    def size(self, name: str) -> int:
        return 1 if self._absent(name) else self.dims[name]

    def group(self, name: str):
        """The process group along ``name`` (``comm.LOCAL``, one rank, for an absent ``cp``)."""
        return LOCAL if self._absent(name) else self.mesh.get_group(name)

    def ranks(self, name: str) -> list[int]:
        """Global ranks in this rank's group along ``name``."""
        if self._absent(name):
            return [self.rank]
        return dist.get_process_group_ranks(self.group(name))

    def __repr__(self):
        shape = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        return f"RankGrid({shape}; rank {self.rank} at {self.coords})"
