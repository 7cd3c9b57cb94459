"""Bugs planted into the course's own DDP, for the debugging tools to find.

The gradient sync under test is :mod:`lecture_lib.data_parallel`'s:
:class:`~lecture_lib.data_parallel.DDPNaive` (one all-reduce per gradient) or
:class:`~lecture_lib.data_parallel.DDPFlat` (one all-reduce of all gradients
through a flat buffer). :func:`planted_ddp` wraps a model in one of them with
up to two of the silent bugs of notebook 09 planted:

* ``op="sum"``: the gradients come out *summed* over the ranks instead of
  averaged (every rank's gradient enters the averaging sync ``N`` times too
  large, as when a loss is not divided by the number of ranks). Every replica
  agrees, so only a comparison with one process shows it;
* ``skip=(names...)``: those parameters are left out of the sync; their
  replicas drift apart and :func:`~.consistency.check_gradient_consistency`
  names the first one.

:func:`sync_gradients` is the one-call form: wrap, synchronise, done.
"""
from __future__ import annotations

import torch

from ..comm import group_info
from ..data_parallel import DDPFlat, DDPNaive

OPS = ("mean", "sum")


class _Planted:
    """Runs the course DDP's own sync, with the planted bugs around it."""

    def __init__(self, module: torch.nn.Module, group=None, *, op: str = "mean",
                 skip: tuple[str, ...] = ()):
        check_planted(module, op, skip)
        super().__init__(module, group)
        self.op, self.skip, self.size = op, tuple(skip), group_info(group)[1]

    def finish_gradient_synchronization(self) -> None:
        left_out = {n: p for n, p in self.module.named_parameters() if n in self.skip}
        kept = {n: p.grad for n, p in left_out.items()}
        for p in left_out.values():                  # hidden from the sync: it skips None
            p.grad = None
        if self.op == "sum":
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.size)           # the average of N * g is the sum of g
        try:
            super().finish_gradient_synchronization()
        finally:
            for n, p in left_out.items():
                p.grad = kept[n]


class PlantedDDPNaive(_Planted, DDPNaive):
    """:class:`~lecture_lib.data_parallel.DDPNaive` with the planted bugs."""


class PlantedDDPFlat(_Planted, DDPFlat):
    """:class:`~lecture_lib.data_parallel.DDPFlat` with the planted bugs."""


def check_planted(model: torch.nn.Module, op: str, skip) -> None:
    """Clear errors for an unknown ``op`` or a ``skip`` name the model does not have."""
    if op not in OPS:
        raise ValueError(f"op must be 'mean' or 'sum', not {op!r}")
    unknown = set(skip) - {n for n, _ in model.named_parameters()}
    if unknown:
        raise ValueError(f"skip names no parameter of the model: {sorted(unknown)}")


def planted_ddp(model: torch.nn.Module, *, op: str = "mean", skip: tuple[str, ...] = (),
                flat: bool = False, group=None):
    """The course's DDP around ``model`` (flat or one message per gradient), bugs planted.

    Like every DDP wrapper, building it broadcasts rank 0's parameters.
    """
    check_planted(model, op, skip)
    cls = PlantedDDPFlat if flat else PlantedDDPNaive
    return cls(model, group, op=op, skip=skip)


def sync_gradients(model: torch.nn.Module, op: str = "mean", flat: bool = False,
                   skip: tuple[str, ...] = (), group=None) -> None:
    """All-reduce every parameter's gradient across ``group``, averaged (``op="mean"``).

    The course's DDP sync (:class:`~lecture_lib.data_parallel.DDPFlat` with
    ``flat=True``, else :class:`~lecture_lib.data_parallel.DDPNaive`), run once
    after the backward; ``op="sum"`` and ``skip`` plant the bugs the debugging
    tools must find. Arguments are checked before anything is communicated.
    """
    check_planted(model, op, skip)
    planted_ddp(model, op=op, skip=skip, flat=flat, group=group).finish_gradient_synchronization()
