"""Side by side with ``torch.distributed.pipelining`` (the library baseline).

:func:`compare_with_torch` runs, on every rank and on the same stages of the
same GPT, our executor with the ``1f1b`` schedule and torch's
``PipelineStage`` + ``Schedule1F1B``, alternating step by step on the same
batches (forward and backward only, no optimizer step, so every step starts
from the same weights). It returns both losses, both gradients and both
step times (:func:`~lecture_lib.metrics.wall_time`).
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from ..metrics import wall_time
from ..models import GPT, GPTConfig, MarkovText, lm_loss
from ..runtime import launch
from .execute import PipelineExecutor
from .schedules import make_schedule
from .stage import check_pipeline, split_gpt


def compare_with_torch(cfg: GPTConfig, microbatches: int, batch_size: int, steps: int = 3,
                       seed: int = 0, data_seed: int = 0) -> dict:
    """Rank function: ours vs torch's Schedule1F1B, one stage per rank of the default group."""
    # noqa below: torch.distributed.pipelining takes seconds to import; only this baseline needs it
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B  # noqa: PLC0415

    p, rank, dev = dist.get_world_size(), dist.get_rank(), launch.device()
    schedule = make_schedule("1f1b", p, microbatches)
    check_pipeline(cfg, schedule, batch_size)
    chunk = split_gpt(GPT(cfg, seed).to(dev), p)[rank]
    shape = (batch_size // microbatches, cfg.seq_len, cfg.d_model)
    ours = PipelineExecutor([chunk], schedule, shape)
    stage = PipelineStage(chunk, rank, p, dev)
    theirs = Schedule1F1B(stage, microbatches, loss_fn=lm_loss)
    data = MarkovText(cfg.vocab_size, cfg.seq_len, seed=data_seed)
    out = {"ours": [], "torch": [], "ours_s": [], "torch_s": []}
    for step in range(steps):
        x, y = data.batch(step, batch_size)
        x, y = x.to(dev), y.to(dev)
        for who in ("ours", "torch"):
            chunk.zero_grad(set_to_none=True)
            dist.barrier()
            with wall_time(dev) as t:
                if who == "ours":
                    loss = ours.step(x, y)
                    loss = None if loss is None else loss.item()
                else:
                    losses = []
                    if rank == 0:
                        theirs.step(x)
                    elif rank == p - 1:
                        theirs.step(target=y, losses=losses)
                    else:
                        theirs.step()
                    loss = torch.stack(losses).mean().item() if losses else None
                dist.barrier()
            out[who].append(loss)
            out[who + "_s"].append(t.seconds)
            out[who + "_grads"] = {n: q.grad.detach().cpu().clone()
                                   for n, q in chunk.named_parameters()}
    return out


def step_time_ratio(results: list[dict], skip: int = 1) -> float:
    """Median step time of ours over torch's (the first ``skip`` steps are warm-up)."""
    ours = statistics.median(results[0]["ours_s"][skip:])
    theirs = statistics.median(results[0]["torch_s"][skip:])
    return ours / theirs
