"""3-D parallelism: data x tensor x pipeline (x context) on one rank grid (Narayanan et al. 2021).

Megatron-LM trains GPT-3 175B on 1024 GPUs by combining the three schemes,
each on its own axis of one rank grid (:class:`lecture_lib.mesh.RankGrid`,
tensor parallelism fastest so its group stays inside a node):

* **tensor parallel** (``tp`` group): each block's attention and MLP are split
  Megatron-style (:class:`lecture_lib.tensor_parallel.ParallelBlock`); layer
  norms, embeddings and the head are replicated on the tp ranks;
* **pipeline parallel** (``pp`` group): contiguous blocks form stages
  (:func:`lecture_lib.pipeline.split_gpt`), run by a schedule
  (:class:`lecture_lib.pipeline.PipelineExecutor`), activations sent between the
  ranks with the same tp coordinate;
* **data parallel** (``dp`` group): each replica takes its shard of the batch;
  gradients are averaged once per step, after the last micro-batch, over the
  dp group only (:class:`lecture_lib.data_parallel.DDPFlat`), then the optimizer
  steps, plain AdamW or ZeRO-1 (:class:`lecture_lib.zero.ShardedOptimizer`)
  sharding its state over the dp group;
* **context parallel** (``cp`` group, optional): every rank of the group holds
  a slice of each sequence (:mod:`lecture_lib.context_parallel`); attention
  runs as ring attention (or Ulysses) over the cp group, positions are the
  global ones, and the gradients are averaged over the cp group too (every
  cp rank holds the same weights).

No piece is rewritten here: this module only wires the existing ones to the
grid's groups, which is the lesson: each scheme communicates on its own axis.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from . import launch
from .context_parallel import (
    ContextParallelAttention,
    LayoutPositionEmbedding,
    check_context_parallel,
    positions,
    shard_sequence,
    sync_context_parallel_grads,
)
from .data_parallel import DDPFlat
from .mesh import RankGrid, check_grid, grid_dims
from .metrics import Timer
from .models import GPT, GPTConfig, MarkovText, TrainResult, make_optimizer, shard
from .pipeline import PipelineExecutor, check_pipeline, make_schedule, split_gpt
from .tensor_parallel import ParallelBlock, check_tensor_parallel, gather_full
from .zero import ShardedOptimizer


@dataclass(frozen=True)
class HybridConfig:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1          # per pipeline, per step
    schedule: str = "1f1b"
    zero1: bool = False
    cp: int = 1                    # context parallel: the sequence split over cp ranks
    layout: str = "zigzag"         # cp's slices of the sequence (context_parallel.layout)
    cp_method: str = "ring"        # "ring" or "ulysses"

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def dims(self) -> dict:
        return grid_dims(dp=self.dp, pp=self.pp, cp=self.cp, tp=self.tp)


def check_hybrid(cfg: GPTConfig, par: HybridConfig, batch_size: int,
                 world_size: int | None = None) -> None:
    """Every check that can be made before a process starts; a clear ValueError otherwise."""
    check_grid(par.world_size if world_size is None else world_size, par.dims())
    check_tensor_parallel(cfg, par.tp)
    if par.cp > 1:
        check_context_parallel(cfg, par.cp, par.layout, par.cp_method, par.tp)
    if batch_size % par.dp:
        raise ValueError(f"a batch of {batch_size} does not split over dp={par.dp} replicas")
    schedule = make_schedule(par.schedule, par.pp, par.microbatches)
    check_pipeline(cfg, schedule, batch_size // par.dp)


def build_stage(cfg: GPTConfig, par: HybridConfig, grid: RankGrid, seed: int = 0) -> nn.ModuleList:
    """This rank's pipeline stage of the GPT, its blocks split over the tp group."""
    gpt = GPT(cfg, seed).to(launch.device())
    if par.tp > 1:
        gpt.blocks = nn.ModuleList(ParallelBlock(b, grid.group("tp")) for b in gpt.blocks)
    if par.cp > 1:
        where = positions(grid.coord("cp"), par.cp, cfg.seq_len, par.layout)
        gpt.pos_emb = LayoutPositionEmbedding(gpt.pos_emb, where)
        for block in gpt.blocks:
            block.attn = ContextParallelAttention(block.attn, grid.group("cp"), par.layout,
                                                  par.cp_method)
    return nn.ModuleList([split_gpt(gpt, par.pp)[grid.coord("pp")]])


def _optimizer(params, name: str, lr: float, zero1: bool, group):
    """``models.make_optimizer``'s optimizer, or the same class and settings under ZeRO-1."""
    if not zero1:
        return make_optimizer(params, name, lr)
    like = make_optimizer([torch.zeros(1, requires_grad=True)], name, lr)
    settings = {k: like.defaults[k] for k in ("lr", "weight_decay")}
    return ShardedOptimizer(params, type(like), group=group, **settings)


def train_on_rank(cfg: GPTConfig, par: HybridConfig, batch_size: int, steps: int,
                  lr: float = 1e-2, seed: int = 0, data_seed: int = 0,
                  optimizer: str = "adamw") -> dict:
    """Inside a rank: train this rank's piece; return losses, full params of the stage, timings."""
    grid = RankGrid(**par.dims())
    stage = build_stage(cfg, par, grid, seed)
    schedule = make_schedule(par.schedule, par.pp, par.microbatches)
    local_batch = batch_size // par.dp
    shape = (local_batch // par.microbatches, cfg.seq_len // par.cp, cfg.d_model)
    executor = PipelineExecutor(list(stage), schedule, shape, ranks=grid.ranks("pp"),
                                group=grid.group("pp"))
    model = DDPFlat(stage, group=grid.group("dp"))
    opt = _optimizer(stage.parameters(), optimizer, lr, par.zero1, grid.group("dp"))
    data, timer = MarkovText(cfg.vocab_size, cfg.seq_len, data_seed), Timer(launch.device())
    losses = []
    for step in range(steps):
        x, y = (shard_sequence(t, grid.coord("cp"), par.cp, par.layout)
                for t in shard(data.batch(step, batch_size), grid.coord("dp"), par.dp))
        opt.zero_grad(set_to_none=True)
        with timer("pipeline"):                  # forward + backward of every micro-batch
            record = executor.step(x, y)
        with timer("dp sync"):                   # once per step, dp group only
            model.finish_gradient_synchronization()
        if par.cp > 1:
            with timer("cp sync"):               # the same weights on every cp rank
                sync_context_parallel_grads(stage, grid.group("cp"))
        with timer("optimizer"):
            opt.step()
        if record.loss is not None:
            losses.append(record.loss)
        if step == 0 and steps > 1:
            timer.reset()                        # the first step warms up; time the rest
    timed_steps = max(steps - 1, 1)
    params = gather_full(stage, grid.group("tp"))
    return {"coords": grid.coords, "losses": losses,
            "step_seconds": {k: v / timed_steps for k, v in timer.totals.items()},
            "params": {name.split(".", 1)[1]: t for name, t in params.items()}}


def step_seconds(results: list[dict]) -> float:
    """Measured seconds per step: the slowest rank's (a step ends when every rank is done)."""
    return max(sum(r["step_seconds"].values()) for r in results)


def merge_ranks(results: list[dict], par: HybridConfig) -> TrainResult:
    """One :class:`TrainResult`: the batch's loss per step (mean over the dp replicas and the
    cp slices, all of equal size) and the full parameters (each stage's, from its dp=0, tp=0,
    cp=0 rank)."""
    last = [r["losses"] for r in results if r["coords"]["pp"] == par.pp - 1
            and r["coords"]["tp"] == 0]
    losses = [sum(step) / len(step) for step in zip(*last)]
    params = {}
    for r in results:
        if r["coords"]["dp"] == 0 and r["coords"]["tp"] == 0 and r["coords"].get("cp", 0) == 0:
            params.update(r["params"])
    return TrainResult(losses, params)


def train_hybrid(cfg: GPTConfig, par: HybridConfig, batch_size: int, steps: int,
                 lr: float = 1e-2, seed: int = 0, data_seed: int = 0, optimizer: str = "adamw",
                 timeout: float = 300) -> tuple[TrainResult, list[dict]]:
    """Train on ``dp * tp * pp * cp`` ranks; the merged result and every rank's own report."""
    check_hybrid(cfg, par, batch_size)
    make_optimizer([torch.zeros(1, requires_grad=True)], optimizer, lr)   # bad name: now
    results = launch.run(train_on_rank, par.world_size, cfg, par, batch_size, steps, lr, seed,
                         data_seed, optimizer, timeout=timeout)
    return merge_ranks(results, par), results
