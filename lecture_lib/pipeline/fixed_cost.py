"""The fixed-cost mode: the schedule's shape in real time, free of how busy the CPU is.

``cost=(t_forward, t_backward[, t_weight])`` in seconds per stage and micro-batch: each
action's compute is replaced by a wait of exactly its simulated cost
(:func:`~.simulate.action_costs`), while activation- and gradient-shaped tensors still
travel between the ranks as the schedule says. The measured timeline then shows the
schedule itself even when 4 ranks share 2 cores (a sleeping rank takes no core from the
others). Notebook 06 runs it through ``experiments.train(..., cost=...)``.
"""
from __future__ import annotations

import time

import torch

from .actions import Action, Schedule
from .execute import PipelineExecutor
from .simulate import action_costs


class FixedCostExecutor(PipelineExecutor):
    """The executor with every action's compute replaced by a wait of its cost.

    Receives and sends are the executor's own; what is sent is a tensor of zeros of the
    activation's shape. No loss is computed (``step`` returns None).
    """

    def __init__(self, chunks, schedule: Schedule, activation_shape: tuple, cost, **kwargs):
        super().__init__(chunks, schedule, activation_shape, **kwargs)
        self.costs = action_costs(schedule, *check_cost(cost))
        self.zeros = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        self.run = {"F": self.forward, "B": self.backward, "W": self.weight_gradient}

    def forward(self, a: Action, work) -> list:
        nap_until(time.perf_counter() + self.costs["F"])
        s = self.schedule.stage(self.stage, a.chunk)
        return [] if s == self.last else self.send(self.zeros, s + 1, ("F", a.microbatch, s),
                                                   work)

    def backward(self, a: Action, work) -> list:
        nap_until(time.perf_counter() + self.costs["B"])
        s = self.schedule.stage(self.stage, a.chunk)
        return [] if s == 0 else self.send(self.zeros, s - 1, ("B", a.microbatch, s), work)

    def weight_gradient(self, a: Action, work) -> list:
        nap_until(time.perf_counter() + self.costs["W"])
        return []


def nap_until(deadline: float, nap: float = 0.0005) -> None:
    """Sleep until ``deadline`` (a ``time.perf_counter()`` value) in short naps. One long
    ``time.sleep`` oversleeps by the wake-up latency of an idle CPU on every fixed-cost
    action (about 1.1 ms on the course's 2-core VM); short naps cut that to about 0.4 ms."""
    while (rest := deadline - time.perf_counter()) > 0:
        time.sleep(min(rest, nap))


def check_cost(cost) -> tuple[float, float, float] | None:
    """``(t_forward, t_backward, t_weight)`` from 2 or 3 seconds >= 0 (None stays None)."""
    if cost is None:
        return None
    cost = tuple(cost) + (0.0,) * (3 - len(tuple(cost)))
    if len(cost) != 3 or any(not isinstance(c, (int, float)) or c < 0 for c in cost):
        raise ValueError(f"cost must be (t_forward, t_backward[, t_weight]) in seconds >= 0, "
                         f"not {cost!r}")
    return cost
