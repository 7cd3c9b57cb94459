"""Pipeline parallelism: schedules as data, simulated and executed.

* :mod:`.actions`: a schedule as data (:class:`Action`, :class:`Schedule`).
* :mod:`.schedules`: the actions of GPipe, 1F1B, interleaved 1F1B and ZB-H1
  (:func:`make_schedule`); :mod:`.validate`: complete, matched, deadlock-free
  (:func:`validate`).
* :mod:`.simulate`: per-rank timelines, makespan, bubble and activation memory
  from per-action costs (:func:`simulate`).
* :mod:`.stage`: the small GPT cut into contiguous stages (:func:`split_gpt`).
* :mod:`.execute`: the same schedule on real ranks: one exchange of messages, then
  one action, for every action (:class:`PipelineExecutor`, :func:`exchange`); with
  :mod:`.split_backward` for ZB-H1's B and W. It measures nothing.
* :mod:`.recorder`: opt-in measurement of a step: timeline, message delays,
  activation bytes (:class:`StepRecorder`, watching through :mod:`lecture_lib.observe`).
* :mod:`.experiments`: what notebook 06 runs: ``train``, ``train_many``, the
  fixed-cost mode (:mod:`.fixed_cost`), one step in emulated time on the small GPT
  (``measure_emulated_bubbles``) and at real size in the dry run (``time_at_scale``),
  ``bubble_report``; imported by its module
  (``from lecture_lib.pipeline import experiments as ppx``), the package exports
  only the algorithm.
* :mod:`.baseline`: side by side with ``torch.distributed.pipelining``.

Closed forms (bubble, activation memory) live in :mod:`lecture_lib.costmodel.pipeline`;
the Gantt-chart explorer in :mod:`lecture_lib.figures.widgets.pipeline`.
"""
from .actions import Action, Schedule
from .baseline import compare_with_torch, step_time_ratio
from .execute import PipelineExecutor, exchange
from .recorder import StepRecord, StepRecorder, aligned, message_latency
from .schedules import NAMES, make_schedule
from .simulate import (
                          Simulation,
                          action_costs,
                          bubble_of,
                          busy_time,
                          dependency_violations,
                          makespan_of,
                          simulate,
)
from .stage import PipelineChunk, check_pipeline, check_split, layer_ranges, split_gpt
from .validate import dependencies, messages, topological_order, validate

__all__ = [
    "Action", "NAMES", "PipelineChunk", "PipelineExecutor", "Schedule", "Simulation",
    "StepRecord", "StepRecorder", "action_costs", "aligned", "bubble_of", "busy_time",
    "check_pipeline", "check_split", "compare_with_torch", "dependencies",
    "dependency_violations", "exchange", "layer_ranges", "make_schedule", "makespan_of",
    "message_latency", "messages", "simulate", "split_gpt", "step_time_ratio",
    "topological_order", "validate",
]
