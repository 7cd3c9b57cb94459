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
  sharding its state over the dp group (ZeRO-2 and FSDP shard a dp-only model);
* **context parallel** (``cp`` group, optional): every rank of the group holds
  a slice of each sequence (:mod:`lecture_lib.context_parallel`); attention
  runs as ring attention (or Ulysses) over the cp group, positions are the
  global ones, and the gradients are averaged over the cp group too (every
  cp rank holds the same weights).

No piece is rewritten here: this module only wires the existing ones to the
grid's groups, which is the lesson: each scheme communicates on its own axis.
A layout is one :class:`lecture_lib.dims.ParallelDims`; :func:`parallelize`
applies it to a GPT in one fixed order (as torchtitan's ``parallelize_llama``):
tensor parallel blocks, then context parallel attention and positions, then the
pipeline stage split, then the data-parallel wrapper and the ZeRO optimizer. It
returns a :class:`RankModel`, whose ``train_step`` is the one training step the
capstone, the calibration and the profiling share.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .comm import collective, maybe
from .context_parallel import (
    ContextParallelAttention,
    LayoutPositionEmbedding,
    check_context_parallel,
    positions,
    shard_sequence,
    sync_context_parallel_grads,
)
from .data_parallel import DDPFlat
from .dims import ParallelDims
from .mesh import RankGrid
from .metrics import Timer
from .models import GPT, GPTConfig, MarkovText, TrainResult, make_optimizer, shard
from .pipeline import PipelineExecutor, check_pipeline, exchange, make_schedule, split_gpt
from .runtime import launch
from .tensor_parallel import ParallelBlock, check_tensor_parallel, gather_full
from .zero import (
    FullyShardedModel,
    ShardedOptimizer,
    fsdp_gather_full_params,
    fsdp_on_after_backward,
)


def _phase(timer: Timer | None, name: str):
    """``timer(name)`` when there is a timer, else nothing to time."""
    return maybe(None if timer is None else timer(name))


def check_hybrid(cfg: GPTConfig, dims: ParallelDims, batch_size: int,
                 world_size: int | None = None) -> None:
    """Every check that can be made before a process starts; a clear ValueError otherwise."""
    dims.check(dims.world_size if world_size is None else world_size)
    check_tensor_parallel(cfg, dims.tp)
    if dims.cp > 1:
        check_context_parallel(cfg, dims.cp, dims.cp_layout, dims.cp_method, dims.tp)
    if dims.ep > 1:
        raise ValueError(f"the GPT has no experts: ep must be 1, not {dims.ep}")
    if dims.zero_stage > 1 and (dims.tp, dims.pp, dims.cp) != (1, 1, 1):
        raise ValueError(f"ZeRO stage {dims.zero_stage} shards the whole model over dp: "
                         f"tp, pp and cp must be 1, not {dims.tp}, {dims.pp}, {dims.cp}")
    microbatches, _ = dims.split(batch_size)
    schedule = make_schedule(dims.schedule, dims.pp, microbatches)
    check_pipeline(cfg, schedule, batch_size // dims.dp)


# ----------------------------------------------------------------------------
# parallelize: the schemes applied in one order
# ----------------------------------------------------------------------------

def apply_tensor_parallel(gpt: GPT, grid: RankGrid) -> None:
    """Each block's attention and MLP split Megatron-style over the tp group."""
    gpt.blocks = nn.ModuleList(ParallelBlock(b, grid.group("tp")) for b in gpt.blocks)


def apply_context_parallel(gpt: GPT, dims: ParallelDims, grid: RankGrid) -> None:
    """Attention over the cp group (ring or Ulysses) and this rank's global positions."""
    where = positions(grid.coord("cp"), dims.cp, gpt.cfg.seq_len, dims.cp_layout)
    gpt.pos_emb = LayoutPositionEmbedding(gpt.pos_emb, where)
    for block in gpt.blocks:
        block.attn = ContextParallelAttention(block.attn, grid.group("cp"), dims.cp_layout,
                                              dims.cp_method)


def apply_pipeline(gpt: GPT, dims: ParallelDims, grid: RankGrid) -> nn.ModuleList:
    """This rank's stage: contiguous blocks, the ``pp`` coordinate's share."""
    return nn.ModuleList([split_gpt(gpt, dims.pp)[grid.coord("pp")]])


def apply_data_parallel(module: nn.Module, dims: ParallelDims, grid: RankGrid, optimizer: str,
                        lr: float) -> tuple[nn.Module, DDPFlat | None, torch.optim.Optimizer]:
    """The dp wrapper and the optimizer of ``dims.zero_stage``: ``(module, ddp, optimizer)``.

    Stage 0: one all-reduce of the gradients (:class:`DDPFlat`), then ``optimizer``; 1: the
    same all-reduce, then ZeRO-1's sharded step; 2: ZeRO-2's reduce-scatter in backward; 3:
    FSDP (:class:`~lecture_lib.zero.FullyShardedModel`)."""
    group, stage = grid.group("dp"), dims.zero_stage
    if stage == 3:
        module = FullyShardedModel(module, group=group)
        return module, None, make_optimizer(module.parameters(), optimizer, lr)
    like = make_optimizer([torch.zeros(1, requires_grad=True)], optimizer, lr)
    settings = {k: like.defaults[k] for k in ("lr", "weight_decay")}
    if stage == 2:
        return module, None, ShardedOptimizer(module.parameters(), type(like), group=group,
                                              gradients="reduce_scatter", **settings)
    ddp = DDPFlat(module, group=group)
    if stage == 1:
        return module, ddp, ShardedOptimizer(module.parameters(), type(like), group=group,
                                             **settings)
    return module, ddp, make_optimizer(module.parameters(), optimizer, lr)


def recorded_exchange(sends, recvs, group=None) -> list:
    """The pipeline's :func:`~lecture_lib.pipeline.exchange`, counted by the comm recorder
    (kind ``"send"``, the bytes this rank sends; the time includes waiting for the receives)."""
    nbytes = sum(t.numel() * t.element_size() for t, _ in sends)
    size = len({peer for _, peer in list(sends) + list(recvs)}) + 1
    with collective("send", nbytes, size, "pipeline", launch.device()):
        return exchange(sends, recvs, group)


def parallelize(model: GPT, dims: ParallelDims, grid: RankGrid, optimizer: str = "adamw",
                lr: float = 1e-2) -> RankModel:
    """Apply ``dims`` to ``model`` on this rank, in a fixed order; what the rank trains.

    1. tensor parallel blocks (tp group), 2. context parallel attention and positions
    (cp group), 3. the pipeline stage split (pp), 4. the data-parallel wrapper and the
    optimizer of the ZeRO stage (dp). Stages 2 and 3 shard the whole model, so they take
    ``tp = pp = cp = 1`` (:func:`check_hybrid`).
    """
    cfg = model.cfg
    if dims.tp > 1:
        apply_tensor_parallel(model, grid)
    if dims.cp > 1:
        apply_context_parallel(model, dims, grid)
    piece = apply_pipeline(model, dims, grid) if dims.zero_stage < 2 else model
    module, ddp, opt = apply_data_parallel(piece, dims, grid, optimizer, lr)
    return RankModel(dims, grid, module, opt, ddp, (cfg.seq_len // dims.cp, cfg.d_model))


@dataclass
class RankModel:
    """A rank's share of the model, its optimizer, and how one training step runs."""
    dims: ParallelDims
    grid: RankGrid
    module: nn.Module               # the pipeline stage (a ModuleList of one) or the ZeRO-2/3 GPT
    optimizer: torch.optim.Optimizer
    ddp: DDPFlat | None             # the gradient all-reduce over dp (ZeRO stages 0 and 1)
    activation_tail: tuple          # an activation's shape after the micro-batch: (s / cp, d)
    _executors: dict = field(default_factory=dict)

    @property
    def pipelined(self) -> bool:
        return self.ddp is not None

    def executor(self, local_batch: int) -> PipelineExecutor:
        """The pipeline executor for this rank's batch of ``local_batch`` sequences."""
        if local_batch not in self._executors:
            m, b = self.dims.split(local_batch * self.dims.dp)
            schedule = make_schedule(self.dims.schedule, self.dims.pp, m)
            self._executors[local_batch] = PipelineExecutor(
                list(self.module), schedule, (b, *self.activation_tail),
                ranks=self.grid.ranks("pp"), group=self.grid.group("pp"),
                exchange=recorded_exchange)
        return self._executors[local_batch]

    def forward_backward(self, x, y, timer: Timer | None = None) -> float | None:
        """Gradients of this rank's batch, synchronised; its mean loss (None where the
        rank computes none: not the last pipeline stage)."""
        self.optimizer.zero_grad(set_to_none=True)
        if not self.pipelined:
            m, _ = self.dims.split(x.shape[0] * self.dims.dp)
            with _phase(timer, "forward-backward"):
                loss = sum(self._backward(xm, ym, m) for xm, ym in zip(x.chunk(m), y.chunk(m)))
                if isinstance(self.module, FullyShardedModel):
                    fsdp_on_after_backward(self.module, self.optimizer)
            return float(loss)
        with _phase(timer, "pipeline"):        # forward + backward of each micro-batch
            record = self.executor(x.shape[0]).step(x, y)
        with _phase(timer, "dp sync"):         # once per step, dp group only
            self.ddp.finish_gradient_synchronization()
        if self.dims.cp > 1:
            with _phase(timer, "cp sync"):     # the same weights on every cp rank
                sync_context_parallel_grads(self.module, self.grid.group("cp"))
        return record.loss

    def _backward(self, x, y, microbatches: int) -> torch.Tensor:
        loss = self.module(x.to(launch.device()), y.to(launch.device())) / microbatches
        loss.backward()
        return loss.detach()

    def update(self, timer: Timer | None = None) -> None:
        with _phase(timer, "optimizer"):
            self.optimizer.step()

    def train_step(self, x, y, timer: Timer | None = None) -> float | None:
        """One step: :meth:`forward_backward`, then :meth:`update`; the loss."""
        loss = self.forward_backward(x, y, timer)
        self.update(timer)
        return loss

    def full_params(self) -> dict:
        """``{canonical name: full tensor}`` of this rank's piece (tp slices gathered)."""
        if isinstance(self.module, FullyShardedModel):
            return {k: v.cpu().clone() for k, v in fsdp_gather_full_params(self.module).items()}
        if not self.pipelined:
            return {k: p.detach().cpu().clone() for k, p in self.module.named_parameters()}
        params = gather_full(self.module, self.grid.group("tp"))
        return {name.split(".", 1)[1]: t for name, t in params.items()}


# ----------------------------------------------------------------------------
# Hybrid training: every rank runs the same loop on its piece
# ----------------------------------------------------------------------------

def train_on_rank(cfg: GPTConfig, dims: ParallelDims, batch_size: int, steps: int,
                  lr: float = 1e-2, seed: int = 0, data_seed: int = 0,
                  optimizer: str = "adamw") -> dict:
    """Inside a rank: train this rank's piece; return losses, full params of the piece, timings."""
    grid = RankGrid.from_dims(dims)
    model = parallelize(GPT(cfg, seed).to(launch.device()), dims, grid, optimizer, lr)
    data, timer = MarkovText(cfg.vocab_size, cfg.seq_len, data_seed), Timer(launch.device())
    losses = []
    for step in range(steps):
        x, y = (shard_sequence(t, grid.coord("cp"), dims.cp, dims.cp_layout)
                for t in shard(data.batch(step, batch_size), grid.coord("dp"), dims.dp))
        loss = model.train_step(x, y, timer)
        if loss is not None:
            losses.append(loss)
        if step == 0 and steps > 1:
            timer.reset()                        # the first step warms up; time the rest
    timed_steps = max(steps - 1, 1)
    return {"coords": grid.coords, "losses": losses,
            "step_seconds": {k: v / timed_steps for k, v in timer.totals.items()},
            "params": model.full_params()}


def step_seconds(results: list[dict]) -> float:
    """Measured seconds per step: the slowest rank's (a step ends when every rank is done)."""
    return max(sum(r["step_seconds"].values()) for r in results)


def merge_ranks(results: list[dict], dims: ParallelDims) -> TrainResult:
    """One :class:`TrainResult`: the batch's loss per step (mean over the dp replicas and the
    cp slices, all of equal size) and the full parameters (each stage's, from its dp=0, tp=0,
    cp=0 rank)."""
    last = [r["losses"] for r in results if r["coords"]["pp"] == dims.pp - 1
            and r["coords"]["tp"] == 0]
    losses = [sum(step) / len(step) for step in zip(*last)]
    params = {}
    for r in results:
        if r["coords"]["dp"] == 0 and r["coords"]["tp"] == 0 and r["coords"]["cp"] == 0:
            params.update(r["params"])
    return TrainResult(losses, params)


def train_hybrid(cfg: GPTConfig, dims: ParallelDims, batch_size: int, steps: int,
                 lr: float = 1e-2, seed: int = 0, data_seed: int = 0, optimizer: str = "adamw",
                 timeout: float = 300) -> tuple[TrainResult, list[dict]]:
    """Train on ``dp * tp * pp * cp`` ranks; the merged result and every rank's own report."""
    check_hybrid(cfg, dims, batch_size)
    make_optimizer([torch.zeros(1, requires_grad=True)], optimizer, lr)   # bad name: now
    results = launch.run(train_on_rank, dims.world_size, cfg, dims, batch_size, steps, lr, seed,
                         data_seed, optimizer, timeout=timeout)
    return merge_ranks(results, dims), results
