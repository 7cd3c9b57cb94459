"""Pipeline parallelism: schedules as data, simulated and executed.

* :mod:`.schedules`: the actions of GPipe, 1F1B, interleaved 1F1B and ZB-H1,
  and the validator (:func:`make_schedule`, :func:`validate`).
* :mod:`.simulate`: per-rank timelines, makespan, bubble and activation memory
  from per-action costs (:func:`simulate`).
* :mod:`.execute`: the same schedule on real ranks: stages of the small GPT,
  activations and gradients sent to the neighbouring stage, every action timed.
"""
from .schedules import NAMES, Action, Schedule, make_schedule, validate
from .simulate import Simulation, bubble_of, makespan_of, simulate
from .execute import (PipelineChunk, PipelineExecutor, PipelineRun, StepRecord, check_pipeline,
                      check_split, exchange, merge, message_latency, split_gpt, train, train_many,
                      train_stage)
from .baseline import compare_with_torch, step_time_ratio
