"""The steps notebook 09 profiles: the course's own schemes, on the small GPT.

``make_step(timer, ...)`` factories for :func:`~.profiler.profile_run`; each
builds its model on the rank and returns ``step(i)``:

* :func:`data_parallel_step`: one of :mod:`lecture_lib.data_parallel`'s
  wrappers (``"naive"`` one all-reduce per gradient, ``"flat"`` one for all,
  ``"individual"`` and ``"bucketed"`` overlapped with the backward pass), or
  torch's ``DistributedDataParallel`` (``"torch"``) to compare with;
* :func:`pipeline_step`: the small GPT cut into one stage per rank and run by a
  schedule (GPipe by default): the layout ``ParallelDims(pp=world)`` and its recipe applied
  by :func:`lecture_lib.hybrid.parallelize`, and its one training step (which marks its
  phases for :mod:`lecture_lib.observe`, not for the timer).

Both sample their first ``presampled`` batches when the step is built, before the profile
starts, as a data loader prepares batches ahead of the training loop: sampling the Markov
text is not the step's work, and under the emulation it would be charged as GPU kernels.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..data_parallel import wrap
from ..dims import ParallelDims, Recipe
from ..hybrid import check_hybrid, parallelize
from ..mesh import RankGrid
from ..models import GPT, GPTConfig, MarkovText, shard
from ..runtime import launch

SYNCS = ("naive", "flat", "individual", "bucketed", "torch")
_ALIASES = {"ddp": "torch", "per_param": "naive"}      # the names notebook 09 first used
_OVERLAPPED = ("individual", "bucketed", "torch")      # communicate during the backward


def _small_gpt(cfg, seed):
    cfg = cfg or GPTConfig(d_model=64, n_layers=2, seq_len=32, n_heads=4)
    return cfg, GPT(cfg, seed).to(launch.device()), MarkovText(cfg.vocab_size, cfg.seq_len, seed)


def _batches(data, batch_size: int, presampled: int):
    """``batch(i)``: step i's global batch, the first ``presampled`` sampled now."""
    ready = [data.batch(i, batch_size) for i in range(presampled)]
    return lambda i: ready[i] if i < presampled else data.batch(i, batch_size)


def data_parallel_step(timer, batch_size: int = 16, sync: str = "torch", cfg=None,
                       bucket_cap_mb: float = 25.0, lr: float = 0.1, seed: int = 0,
                       presampled: int = 8):
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
    batch = _batches(data, batch_size, presampled)

    def step(i):
        x, y = (t.to(launch.device()) for t in shard(batch(i), rank, size))
        with timer("forward"):
            loss = ddp(x, y)
        with timer("backward"):
            loss.backward()
        with timer("wait" if name in _OVERLAPPED else "comm"):
            ddp.finish_gradient_synchronization()
        with timer("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    step.model = model                              # for checks
    return step


def pipeline_step(timer, batch_size: int = 16, microbatches: int = 4, cfg=None,
                  lr: float = 0.1, seed: int = 0, schedule: str = "gpipe", presampled: int = 8):
    """A pipeline step: the small GPT cut into one stage per rank, run by the course's
    executor with ``schedule`` (``"gpipe"``: all forwards, then all backwards,
    Huang et al. 2019; or ``"1f1b"``, ...), then SGD on this rank's stage."""
    dims = ParallelDims(pp=dist.get_world_size())
    recipe = Recipe(microbatches=microbatches, schedule=schedule)
    cfg, model, data = _small_gpt(cfg, seed)
    check_hybrid(cfg, dims, recipe, batch_size)
    rank_model = parallelize(model, dims, recipe, RankGrid.from_dims(dims), "sgd", lr)
    batch = _batches(data, batch_size, presampled)

    def step(i):
        x, y = (t.to(launch.device()) for t in batch(i))
        rank_model.step(x, y)
    step.model, step.params = model, list(rank_model.module.parameters())   # for checks
    return step
