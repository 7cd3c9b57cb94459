"""Pipeline parallelism: schedules as data, simulated and executed.

* :mod:`.schedules`: the actions of GPipe, 1F1B, interleaved 1F1B and ZB-H1,
  and the validator (:func:`make_schedule`, :func:`validate`).
* :mod:`.simulate`: per-rank timelines, makespan, bubble and activation memory
  from per-action costs (:func:`simulate`).
* :mod:`.execute`: the same schedule on real ranks: stages of the small GPT,
  activations and gradients sent to the neighbouring stage, every action timed
  (:func:`train`, :func:`train_many`, :class:`PipelineExecutor`, :func:`exchange`).
* :mod:`.baseline`: side by side with ``torch.distributed.pipelining``.

Closed forms (bubble, activation memory) live in :mod:`lecture_lib.costmodel.pipeline`;
the Gantt-chart explorer in :mod:`lecture_lib.widgets.pipeline`.
"""
from .schedules import NAMES, Action, Schedule, make_schedule, validate
from .simulate import (Simulation, action_costs, bubble_of, busy_time, dependency_violations,
                       makespan_of, simulate)
from .execute import (PipelineChunk, PipelineExecutor, PipelineRun, StepRecord, check_pipeline,
                      check_split, exchange, merge, message_latency, split_gpt, train, train_many,
                      train_stage)
from .baseline import compare_with_torch, step_time_ratio
