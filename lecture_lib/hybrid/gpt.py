"""3-D parallelism: data x tensor x pipeline (x context) on one rank grid (Narayanan et al. 2021).

Megatron-LM trains GPT-3 175B on 1024 GPUs by giving each scheme an axis of one rank grid
(:class:`lecture_lib.mesh.RankGrid`); each scheme talks only to the ranks along its axis::

    dp=2 x pp=2 x tp=2 (tp fastest)      tp: a block's heads and MLP columns split,
                                             the vocabulary too (embedding, head, loss);
                                             two all-reduces per block, inside a node
         stage 0      stage 1            pp: contiguous blocks per stage; activations
    dp0 [r0 r1] ---> [r2 r3]                 forward, gradients back, per micro-batch
    dp1 [r4 r5] ---> [r6 r7]             dp: a shard of the batch; gradients averaged
                                             once per step, in buckets during the last
                                             backward (r0 with r4, r1 with r5, ...)

A context-parallel axis ``cp`` (just outside tp) splits every sequence too: attention
passes keys and values around the cp group (ring or Ulysses), and the cp ranks average
their gradients like data-parallel replicas.

:func:`parallelize` applies a layout (:class:`~lecture_lib.dims.ParallelDims`) and a recipe
(:class:`~lecture_lib.dims.Recipe`) to a GPT in one fixed order, as torchtitan's
``parallelize_llama`` does, wiring the course's own pieces without rewriting any; it returns
a :class:`RankModel`, whose :meth:`~RankModel.step` is the training step the hybrid trainer,
the capstone, the calibration and the profiling share.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from .. import observe
from ..comm import collective
from ..context_parallel import (
    ContextParallelAttention,
    LayoutPositionEmbedding,
    check_context_parallel,
    make_attention,
    positions,
    sync_context_parallel_grads,
)
from ..data_parallel import DDPBucketed
from ..dims import ParallelDims, Recipe
from ..mesh import RankGrid
from ..models import GPT, GPTConfig, lm_loss, make_optimizer
from ..pipeline import PipelineExecutor, check_pipeline, exchange, make_schedule, split_gpt
from ..runtime import launch
from ..tensor_parallel import (
    ColumnParallelLinear,
    ParallelBlock,
    VocabParallelEmbedding,
    check_tensor_parallel,
    gather_full,
    vocab_parallel_lm_loss,
)
from ..zero import (
    FullyShardedModel,
    ShardedGradientOptimizer,
    ShardedOptimizer,
    fsdp_gather_full_params,
    fsdp_on_after_backward,
)

BUCKET_MB = 25          # ZeRO-0's gradient buckets: torch DDP's default bucket_cap_mb


def parallelize(model: GPT, dims: ParallelDims, recipe: Recipe, grid: RankGrid,
                optimizer: str = "adamw", lr: float = 1e-2) -> RankModel:
    """This rank's share of ``model`` under ``dims`` and ``recipe``, in a fixed order:

    1. tensor parallelism (tp group): notebook 04's Megatron split, blocks, embedding,
    head and loss; 2. context-parallel attention and positions
    (cp group); 3. this rank's pipeline stage (pp group); 4. the data-parallel gradient
    sync and the optimizer of the ZeRO stage (dp group). ZeRO-2 and -3 shard the whole
    model over dp, so they take ``tp = pp = cp = 1`` (:func:`check_hybrid`).
    """
    loss_fn = apply_tensor_parallel(model, grid) if dims.tp > 1 else lm_loss
    if dims.cp > 1:
        apply_context_parallel(model, dims, recipe, grid)
    if recipe.zero_stage >= 2:
        return apply_sharded_data_parallel(model, dims, recipe, grid, optimizer, lr)
    stage = nn.ModuleList([split_gpt(model, dims.pp)[grid.coord("pp")]])
    return apply_data_parallel(stage, model.cfg, dims, recipe, grid, optimizer, lr, loss_fn)


class RankModel:
    """A rank's share of the model, its optimizer, and one training step.

    ZeRO stages 0 and 1 run a pipeline stage (the only one when ``pp = 1``) through the
    executor, then average the gradients over dp (ZeRO-1: in its optimizer's step) and
    cp; stages 2 and 3 run the whole model, each micro-batch's gradients reduce-scattered
    as backward produces them.
    """

    def __init__(self, dims: ParallelDims, recipe: Recipe, grid: RankGrid, module: nn.Module,
                 optimizer: torch.optim.Optimizer, ddp: DDPBucketed | None = None,
                 activation_shape: tuple = (), loss_fn=lm_loss):
        self.dims, self.recipe, self.grid = dims, recipe, grid
        self.module, self.optimizer, self.ddp = module, optimizer, ddp
        self.loss_fn = loss_fn                      # (logits, targets) -> mean loss
        self.activation_shape = activation_shape    # (s / cp, d): one sequence's activations
        self.executor: PipelineExecutor | None = None

    @property
    def runs_pipeline(self) -> bool:
        """Does this rank run a pipeline stage (ZeRO 0-1), not the whole sharded model?"""
        return self.recipe.zero_stage < 2

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """One training step on this rank's batch: gradients, then the update; the loss."""
        loss = self.forward_backward(x, y)
        self.update()
        return loss

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """Gradients of this rank's batch, synchronised; its mean loss as a tensor (None on
        a rank that computes none: not the last pipeline stage)."""
        self.optimizer.zero_grad(set_to_none=True)
        if not self.runs_pipeline:
            return self._sharded_forward_backward(x, y)
        executor = self._executor(x.shape[0])
        if self.ddp is not None:                       # buckets go out in the last backward
            self.ddp.accumulation = executor.schedule.microbatches
        with observe.span("pipeline"):                 # forward + backward of each micro-batch
            loss = executor.step(x, y)
        if self.ddp is not None:                       # ZeRO-1: in the optimizer's step
            with observe.span("dp sync"):              # wait for the buckets, dp group only
                self.ddp.finish_gradient_synchronization()
        if self.dims.cp > 1:
            with observe.span("cp sync"):              # the same weights on every cp rank
                sync_context_parallel_grads(self.module, self.grid.group("cp"))
        return loss

    def update(self) -> None:
        with observe.span("optimizer"):
            self.optimizer.step()

    def full_params(self) -> dict:
        """``{canonical name: full tensor}`` of this rank's piece (tp slices gathered)."""
        if isinstance(self.module, FullyShardedModel):
            return {k: v.cpu().clone() for k, v in fsdp_gather_full_params(self.module).items()}
        if not self.runs_pipeline:
            return {k: p.detach().cpu().clone() for k, p in self.module.named_parameters()}
        params = gather_full(self.module, self.grid.group("tp"))
        # names in the ModuleList of one stage start "0.": drop it
        return {name.split(".", 1)[1]: t for name, t in params.items()}

    def _executor(self, local_batch: int) -> PipelineExecutor:
        """The pipeline executor for a batch of ``local_batch`` sequences (made again only
        when the batch size changes: its receive buffers have a micro-batch's shape)."""
        m, b = self.recipe.split(local_batch * self.dims.dp, self.dims.dp)
        if self.executor is None or self.executor.shape[0] != b \
                or self.executor.schedule.microbatches != m:
            schedule = make_schedule(self.recipe.schedule, self.dims.pp, m)
            self.executor = PipelineExecutor(
                list(self.module), schedule, (b, *self.activation_shape),
                ranks=self.grid.ranks("pp"), group=self.grid.group("pp"),
                exchange=exchange_as_comm, loss_fn=self.loss_fn)
        return self.executor

    def _sharded_forward_backward(self, x, y) -> torch.Tensor:
        m, _ = self.recipe.split(x.shape[0] * self.dims.dp, self.dims.dp)
        with observe.span("forward-backward"):
            loss = None
            for xm, ym in zip(x.chunk(m), y.chunk(m)):
                part = self.module(xm.to(launch.device()), ym.to(launch.device())) / m
                part.backward()
                loss = part.detach() if loss is None else loss + part.detach()
            if isinstance(self.module, FullyShardedModel):
                fsdp_on_after_backward(self.module, self.optimizer)
        return loss


# ----------------------------------------------------------------------------
# The four steps of parallelize
# ----------------------------------------------------------------------------

def apply_tensor_parallel(gpt: GPT, grid: RankGrid):
    """Notebook 04's Megatron split over the tp group: the token embedding by vocabulary
    rows, each block's attention by heads and MLP by columns, the head by vocabulary
    columns (logits stay split). Returns the loss that takes split logits."""
    group = grid.group("tp")
    gpt.tok_emb = VocabParallelEmbedding(gpt.tok_emb, group)
    gpt.blocks = nn.ModuleList(ParallelBlock(b, group) for b in gpt.blocks)
    gpt.head = ColumnParallelLinear.from_linear(gpt.head, group)
    return functools.partial(vocab_parallel_lm_loss, group=group)


def apply_context_parallel(gpt: GPT, dims: ParallelDims, recipe: Recipe, grid: RankGrid) -> None:
    """Attention over the cp group (ring or Ulysses) and this rank's global positions."""
    where = positions(grid.coord("cp"), dims.cp, gpt.cfg.seq_len, recipe.cp_layout)
    gpt.pos_emb = LayoutPositionEmbedding(gpt.pos_emb, where)
    attend = make_attention(recipe.cp_method, grid.group("cp"), recipe.cp_layout)
    for block in gpt.blocks:
        block.attn = ContextParallelAttention(block.attn, attend)


def apply_data_parallel(stage: nn.ModuleList, cfg: GPTConfig, dims: ParallelDims,
                        recipe: Recipe, grid: RankGrid, optimizer: str, lr: float,
                        loss_fn=lm_loss) -> RankModel:
    """A pipeline stage over dp. ZeRO 0: its gradients all-reduced in buckets of
    :data:`BUCKET_MB` during the last micro-batch's backward (:class:`DDPBucketed`, notebook
    02's DDP), then the one-process optimizer. ZeRO-1: no all-reduce; the optimizer
    reduce-scatters the local gradients, steps this rank's shards and all-gathers them
    (the same bytes: a ring all-reduce is a reduce-scatter and an all-gather)."""
    group = grid.group("dp")
    opt = make_optimizer(stage.parameters(), optimizer, lr)
    activations = (cfg.seq_len // dims.cp, cfg.d_model)
    if recipe.zero_stage == 1:
        opt = ShardedOptimizer(stage.parameters(), type(opt), group=group, gradients="local",
                               **_settings(opt))
        return RankModel(dims, recipe, grid, stage, opt, None, activations, loss_fn)
    return RankModel(dims, recipe, grid, stage, opt, DDPBucketed(stage, BUCKET_MB, group=group),
                     activations, loss_fn)


def apply_sharded_data_parallel(gpt: GPT, dims: ParallelDims, recipe: Recipe, grid: RankGrid,
                                optimizer: str, lr: float) -> RankModel:
    """The whole model over dp: ZeRO-2 (gradients reduce-scattered in backward, the
    optimizer on shards) or ZeRO-3 (:class:`~lecture_lib.zero.FullyShardedModel`)."""
    group = grid.group("dp")
    if recipe.zero_stage == 3:
        module = FullyShardedModel(gpt, group=group)
        return RankModel(dims, recipe, grid, module,
                         make_optimizer(module.parameters(), optimizer, lr))
    opt = make_optimizer(gpt.parameters(), optimizer, lr)
    return RankModel(dims, recipe, grid, gpt,
                     ShardedGradientOptimizer(gpt.parameters(), type(opt), group=group,
                                              **_settings(opt)))


def _settings(opt: torch.optim.Optimizer) -> dict:
    """The settings of the one-process optimizer (:func:`~lecture_lib.models.make_optimizer`)
    that ZeRO's sharded copy takes; the one-process optimizer itself holds no state yet
    (torch makes it at the first step) and is dropped."""
    return {k: opt.defaults[k] for k in ("lr", "weight_decay")}


def exchange_as_comm(sends, recvs, group=None) -> list:
    """The pipeline's :func:`~lecture_lib.pipeline.exchange`, marked as a ``"comm"`` span of
    kind ``"send"`` (the bytes this rank sends; its time includes the wait for the receives)
    for whoever watches (:func:`lecture_lib.comm.record_comm`)."""
    nbytes = sum(t.numel() * t.element_size() for t, _ in sends)
    size = len({peer for _, peer in list(sends) + list(recvs)}) + 1
    with collective("send", nbytes, size, "pipeline", launch.device()):
        return exchange(sends, recvs, group)


def check_hybrid(cfg: GPTConfig, dims: ParallelDims, recipe: Recipe, batch_size: int,
                 world_size: int | None = None) -> None:
    """Every check that can be made before a process starts; a clear ValueError otherwise."""
    dims.check(dims.world_size if world_size is None else world_size)
    check_tensor_parallel(cfg, dims.tp)
    if dims.cp > 1:
        check_context_parallel(cfg, dims.cp, recipe.cp_layout, recipe.cp_method, dims.tp)
    if dims.ep > 1:
        raise ValueError(f"the GPT has no experts: ep must be 1, not {dims.ep}")
    if recipe.zero_stage > 1 and (dims.tp, dims.pp, dims.cp) != (1, 1, 1):
        raise ValueError(f"ZeRO stage {recipe.zero_stage} shards the whole model over dp: "
                         f"tp, pp and cp must be 1, not {dims.tp}, {dims.pp}, {dims.cp}")
    microbatches, _ = recipe.split(batch_size, dims.dp)
    schedule = make_schedule(recipe.schedule, dims.pp, microbatches)
    check_pipeline(cfg, schedule, batch_size // dims.dp)
