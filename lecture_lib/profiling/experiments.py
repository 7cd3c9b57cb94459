"""The steps notebook 09 profiles: the course's own schemes, on the small GPT.

``make_step(timer, ...)`` factories for :func:`~.profiler.profile_run`; each
builds its model on the rank and returns ``step(i)``:

* :func:`data_parallel_step`: one of :mod:`lecture_lib.data_parallel`'s
  wrappers (``"naive"`` one all-reduce per gradient, ``"flat"`` one for all,
  ``"individual"`` and ``"bucketed"`` overlapped with the backward pass), or
  torch's ``DistributedDataParallel`` (``"torch"``) to compare with;
* :func:`pipeline_step`: :class:`lecture_lib.pipeline.PipelineExecutor`
  running a schedule (GPipe by default) over every rank.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import launch
from ..data_parallel import wrap
from ..models import GPT, GPTConfig, MarkovText, shard
from ..pipeline import PipelineExecutor, check_pipeline, make_schedule, split_gpt

SYNCS = ("naive", "flat", "individual", "bucketed", "torch")
_ALIASES = {"ddp": "torch", "per_param": "naive"}      # the names notebook 09 first used
_OVERLAPPED = ("individual", "bucketed", "torch")      # communicate during the backward


def _small_gpt(cfg, seed):
    cfg = cfg or GPTConfig(d_model=64, n_layers=2, seq_len=32, n_heads=4)
    return cfg, GPT(cfg, seed).to(launch.device()), MarkovText(cfg.vocab_size, cfg.seq_len, seed)


def data_parallel_step(timer, batch_size: int = 16, sync: str = "torch", cfg=None,
                       bucket_cap_mb: float = 25.0, lr: float = 0.1, seed: int = 0):
    """A data-parallel step of the small GPT on this rank's shard of the global batch.

    ``sync`` names the wrapper (:data:`SYNCS`; ``"ddp"`` and ``"per_param"`` are
    the older names of ``"torch"`` and ``"naive"``); ``bucket_cap_mb`` sizes the
    buckets of ``"bucketed"`` and ``"torch"``. For the syncs after the backward
    (naive, flat) ``timer("comm")`` holds the all-reduces alone; the overlapped
    ones hide their communication inside the backward pass from a timer (their
    final wait is timed as ``"wait"``), so only the trace can show it.
    """
    name = _ALIASES.get(sync, sync)
    if name not in SYNCS:
        raise ValueError(f"sync must be one of {SYNCS} (or {tuple(_ALIASES)}), not {sync!r}")
    rank, size = dist.get_rank(), dist.get_world_size()
    cfg, model, data = _small_gpt(cfg, seed)
    ddp = wrap(name, model, bucket_size_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step(i):
        x, y = (t.to(launch.device()) for t in shard(data.batch(i, batch_size), rank, size))
        with timer("compute"):
            ddp(x, y).backward()
        with timer("wait" if name in _OVERLAPPED else "comm"):
            ddp.finish_gradient_synchronization()
        with timer("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    step.model = model                              # for checks
    return step


def pipeline_step(timer, batch_size: int = 16, micro_batches: int = 4, cfg=None,
                  lr: float = 0.1, seed: int = 0, schedule: str = "gpipe"):
    """A pipeline step: the small GPT cut into one stage per rank, run by the course's
    executor with ``schedule`` (``"gpipe"``: all forwards, then all backwards,
    Huang et al. 2019; or ``"1f1b"``, ...), then SGD on this rank's stage."""
    p, rank, dev = dist.get_world_size(), dist.get_rank(), launch.device()
    cfg, model, data = _small_gpt(cfg, seed)
    plan = make_schedule(schedule, p, micro_batches)
    check_pipeline(cfg, plan, batch_size)
    chunk = split_gpt(model, p)[rank]
    executor = PipelineExecutor([chunk], plan, (batch_size // micro_batches, cfg.seq_len,
                                                cfg.d_model))
    params = list(chunk.parameters())
    opt = torch.optim.SGD(params, lr=lr)

    def step(i):
        x, y = (t.to(dev) for t in data.batch(i, batch_size))
        with timer("pipeline"):
            executor.step(x, y)
        with timer("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    step.model, step.params = model, params        # this stage's share, for checks
    return step
