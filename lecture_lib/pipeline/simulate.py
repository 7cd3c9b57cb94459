"""The simulator: a schedule plus per-action costs gives every rank's timeline.

Each rank runs its actions in order; an action starts when the rank is free
and every action it depends on has finished (plus ``latency`` for each
message from another rank). Costs are those of a *whole stage* per
micro-batch: with ``v`` chunks per rank a chunk costs 1/v of them. ``B`` costs
``t_backward`` and ``W`` costs ``t_weight``; a schedule without W does the
whole backward in B, which then costs ``t_backward + t_weight``, so every
schedule does the same total work for the same arguments. Each cost is one
number for every stage, or a list with one per stage (rank): unequal stages,
as measured in emulated time, where the slowest stage sets the pace.

From the timeline: the makespan (first start to last end), the bubble
fraction ``1 - busy / (p * makespan)`` (the share of rank-time spent idle; with
uniform costs and no latency it equals (p-1)/(m+p-1) for GPipe and 1F1B,
Huang et al. 2019, and (p-1)/(v m + p-1) interleaved, Narayanan et al. 2021)
and the peak number of micro-batches whose activations each rank holds at once
(from its forward until the backward that frees them: B, or W when the
backward is split; a chunk's activations count 1/v of a micro-batch).
"""
from __future__ import annotations

from dataclasses import dataclass

from .actions import Schedule
from .validate import dependencies, topological_order


@dataclass
class Simulation:
    """What :func:`simulate` found, for one schedule under given costs.

    * ``timeline``: ``{rank: [(kind, start, end, label), ...]}``, times in the unit of the
      costs (seconds when the costs are), ``label`` the action's ``str`` ('F3', 'B2.1');
    * ``makespan``: first start to last end, same unit;
    * ``bubble_fraction``: ``1 - busy / (p * makespan)``, the share of rank-time idle (0..1);
    * ``peak_activations``: per rank, the most micro-batches whose activations it holds at
      once (from a forward to the backward that frees them, B, or W when the backward is
      split), in micro-batches: with ``v`` chunks per rank a chunk's forward counts ``1/v``,
      so 1F1B's rank r holds ``min(m, p - r)`` and interleaved 1F1B's rank r holds
      ``min(m, (w_r + 1) / v)`` after ``w_r`` warm-up forwards.
    """
    schedule: Schedule
    timeline: dict          # rank -> [(kind, start, end, label), ...]
    makespan: float
    bubble_fraction: float
    peak_activations: list  # per rank, in micro-batches (a chunk counts 1/v)

    @property
    def idle_fraction(self) -> list[float]:
        """Per rank: the share of the makespan it is not busy."""
        return [1 - busy_time(spans) / self.makespan if self.makespan else 0.0
                for _, spans in sorted(self.timeline.items())]


def busy_time(spans) -> float:
    return sum(span[2] - span[1] for span in spans)


def makespan_of(timeline: dict) -> float:
    """First start to last end over every rank (simulated or measured timelines)."""
    spans = [s for rank_spans in timeline.values() for s in rank_spans]
    return max(s[2] for s in spans) - min(s[1] for s in spans) if spans else 0.0


def bubble_of(timeline: dict) -> float:
    """``1 - busy / (ranks * makespan)`` of a timeline ``{rank: [(kind, start, end, ...)]}``."""
    span = makespan_of(timeline)
    busy = sum(busy_time(spans) for spans in timeline.values())
    return 1.0 - busy / (len(timeline) * span) if span > 0 else 0.0


def held_microbatches(schedule: Schedule, rank: int) -> list[float]:
    """After each of ``rank``'s actions, how many micro-batches' activations it holds."""
    release = "W" if schedule.split_backward else "B"
    held, out = 0, []
    for a in schedule.actions[rank]:
        if a.kind == "F":
            held += 1
        elif a.kind == release:
            held -= 1
        out.append(held / schedule.chunks)
    return out


def action_costs(schedule: Schedule, t_forward: float, t_backward: float,
                 t_weight: float = 0.0) -> dict:
    """Seconds per F, B and W action of this schedule (per chunk; B includes W when
    the schedule does not split the backward)."""
    v = schedule.chunks
    return {"F": t_forward / v, "W": t_weight / v,
            "B": (t_backward if schedule.split_backward else t_backward + t_weight) / v}


def _per_stage(schedule: Schedule, **costs) -> list[dict]:
    """:func:`action_costs` for each rank; a cost is a number or one number per rank."""
    p, lists = schedule.num_stages, {}
    for name, value in costs.items():
        values = list(value) if isinstance(value, (list, tuple)) else [value] * p
        if len(values) != p or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                   or x < 0 for x in values):
            raise ValueError(f"{name} must be a number >= 0 or {p} of them (one per stage), "
                             f"not {value!r}")
        lists[name] = values
    if any(sum(lists[n][r] for n in lists) <= 0 for r in range(p)):
        raise ValueError("at least one of t_forward, t_backward, t_weight must be > 0")
    return [action_costs(schedule, *(lists[n][r] for n in lists)) for r in range(p)]


def simulate(schedule: Schedule, t_forward, t_backward, t_weight=0.0,
             latency: float = 0.0) -> Simulation:
    """Every rank's timeline under these costs (seconds per stage per micro-batch; a
    number, or a list of one per stage)."""
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or latency < 0:
        raise ValueError(f"latency must be a number >= 0, not {latency!r}")
    cost = _per_stage(schedule, t_forward=t_forward, t_backward=t_backward, t_weight=t_weight)
    deps = dependencies(schedule, synchronous_sends=False)
    end: dict = {}
    timeline: dict = {r: [] for r in range(schedule.num_stages)}
    for rank, i in topological_order(schedule, synchronous_sends=False):
        a = schedule.actions[rank][i]
        start = max((end[d] + (latency if d[0] != rank else 0.0) for d in deps[(rank, i)]),
                    default=0.0)
        end[(rank, i)] = start + cost[rank][a.kind]
        timeline[rank].append((a.kind, start, end[(rank, i)], str(a)))
    return Simulation(schedule, timeline, makespan_of(timeline), bubble_of(timeline),
                      [max(held_microbatches(schedule, r), default=0)
                       for r in range(schedule.num_stages)])


def dependency_violations(schedule: Schedule, timeline: dict, slack: float = 0.0) -> list:
    """Actions of a (measured) timeline that started before an action they depend on
    ended (more than ``slack`` seconds early): ``[(rank, label, rank_dep, label_dep)]``.
    Empty when the ranks obeyed the schedule."""
    deps = dependencies(schedule)
    out = []
    for (rank, i), need in deps.items():
        start = timeline[rank][i][1]
        for r, j in need:
            if timeline[r][j][2] > start + slack:
                out.append((rank, str(schedule.actions[rank][i]), r, str(schedule.actions[r][j])))
    return out
