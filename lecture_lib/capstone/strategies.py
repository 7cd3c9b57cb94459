"""Every strategy of the course behind one interface, for the capstone trainer.

The capstone trains one GPT with each parallel scheme the pack teaches and
wires, rather than rewrites, the library's own pieces (the lesson of
:mod:`lecture_lib.hybrid`: each scheme communicates on its own axis of one
rank grid, Narayanan et al. 2021). A strategy names the axes of the layout
(:class:`lecture_lib.dims.ParallelDims`) it may use and, for the data-parallel ones, the
ZeRO stage of its recipe (:class:`lecture_lib.dims.Recipe`);
:func:`lecture_lib.hybrid.parallelize` builds every one of them:

=========  ==============================================================  ===========
strategy   pieces                                                          grid
=========  ==============================================================  ===========
ddp        :class:`~lecture_lib.data_parallel.DDPBucketed`, AdamW            dp
zero1      ``ShardedOptimizer(gradients="local")``, no all-reduce           dp
zero2      :class:`~lecture_lib.zero.ShardedGradientOptimizer`               dp
fsdp       :class:`~lecture_lib.zero.FullyShardedModel` (ZeRO-3)             dp
tp         :class:`~lecture_lib.tensor_parallel.ParallelBlock` s             tp (x dp)
pp         :class:`~lecture_lib.pipeline.PipelineExecutor`, 1F1B             pp (x dp)
cp         ring attention (:mod:`lecture_lib.context_parallel`)             cp (x dp)
3d         all of tp, pp, cp and dp together (:func:`lecture_lib.hybrid.parallelize`)
=========  ==============================================================  ===========

A :class:`Plan` is what a rank holds (a :class:`~lecture_lib.hybrid.RankModel` and
the checkpoint's names): ``forward_backward(x, y)`` (gradients
synchronised, the local loss or ``None`` on ranks that compute none),
``update()``, ``eval_loss(x, y)`` and ``entries()``: every parameter and optimizer
tensor under its *canonical* name (the one-process GPT's) with how this rank
holds it (:class:`Entry`), which is what :mod:`.checkpoint` saves and loads.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from ..dims import ParallelDims, Recipe
from ..hybrid import check_hybrid, parallelize
from ..mesh import RankGrid
from ..models import GPT, GPTConfig
from ..runtime import device
from ..zero import FullyShardedModel, ShardedOptimizer
from ..zero.experiments import held_bytes

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "tp", "pp", "cp", "3d")
ZERO_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "fsdp": 3}   # the data-parallel-only ones
OWN_AXIS = ("tp", "pp", "cp")


def run_recipe(strategy: str, recipe: Recipe) -> Recipe:
    """The recipe ``strategy`` runs: ``recipe``, with the ZeRO stage of a data-parallel one."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    if strategy not in ZERO_STAGE:
        return recipe
    if recipe.zero_stage not in (0, ZERO_STAGE[strategy]):
        raise ValueError(f"strategy {strategy} is ZeRO stage {ZERO_STAGE[strategy]}, "
                         f"not {recipe.zero_stage}")
    return replace(recipe, zero_stage=ZERO_STAGE[strategy])


def check_strategy(strategy: str, model: GPTConfig, dims: ParallelDims, recipe: Recipe,
                   global_batch: int, world_size: int) -> Recipe:
    """Every check that can be made before a process starts (a clear ValueError otherwise);
    the recipe the strategy runs."""
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"dims must be a ParallelDims, not {type(dims).__name__}")
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe, not {type(recipe).__name__}")
    run = run_recipe(strategy, recipe)
    tp, pp, cp = dims.tp, dims.pp, dims.cp
    if strategy in ZERO_STAGE and (tp, pp, cp) != (1, 1, 1):
        raise ValueError(f"strategy {strategy} shards over data-parallel ranks only: give "
                         f"--dp, not tp={tp} pp={pp} cp={cp} (use 3d to combine them)")
    if strategy in OWN_AXIS:
        others = [k for k in OWN_AXIS if k != strategy and getattr(dims, k) != 1]
        if others:
            raise ValueError(f"strategy {strategy} combines only with dp, not with "
                             f"{', '.join(others)} (use 3d)")
    check_hybrid(model, dims, run, global_batch, world_size)
    return run


@dataclass
class Entry:
    """One tensor this rank holds, under its canonical name.

    ``kind``: ``"full"`` (the whole tensor; every rank that holds it has the same),
    ``"tp"`` (this rank's equal slice along ``dim`` over the tensor-parallel group),
    ``"flat"`` (this rank's slice of the flattened tensor of ``shape`` over the
    data-parallel group, ZeRO's cut: :mod:`lecture_lib.zero.shards`).
    """
    key: str
    tensor: torch.Tensor
    kind: str = "full"
    dim: int = 0
    shape: tuple = ()


class Plan:
    """A rank's share of the model, its optimizer, and how a step runs."""

    def __init__(self, strategy: str, model: GPTConfig, dims: ParallelDims, recipe: Recipe,
                 grid: RankGrid, lr: float, seed: int = 0):
        self.strategy, self.cfg, self.grid = strategy, model, grid
        self.dp_group = grid.group("dp")
        self.rank = parallelize(GPT(model, seed).to(device()), dims, recipe, grid, "adamw", lr)
        self.module, self.optimizer = self.rank.module, self.rank.optimizer

    # -- a step ---------------------------------------------------------------------

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """Gradients of this rank's batch, synchronised; the local mean loss (or None)."""
        return self.rank.forward_backward(x, y)

    def update(self) -> None:
        self.rank.update()

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """The local mean loss of a batch without training (None under pipelining: pp > 1)."""
        if self.rank.runs_pipeline:
            if self.grid.size("pp") > 1:
                return None
            return self.rank.loss_fn(self.module[0](x.to(device())), y.to(device()))
        return self.module(x.to(device()), y.to(device()))

    def holds_loss(self) -> bool:
        """Does this rank's loss count in the global mean (last stage, first tp rank)?"""
        g = self.grid
        return g.coord("pp") == g.size("pp") - 1 and g.coord("tp") == 0

    def held(self) -> dict:
        """Bytes of parameters, gradients and optimizer state this rank holds."""
        return held_bytes(self.module, self.optimizer)

    # -- canonical names --------------------------------------------------------------

    def param_entries(self) -> list[tuple[nn.Parameter, Entry]]:
        """Every parameter of this rank with its :class:`Entry`."""
        if self.rank.runs_pipeline:
            return [(p, Entry(name.split(".", 1)[1], p.data,
                              "full" if getattr(p, "tp_dim", None) is None else "tp",
                              getattr(p, "tp_dim", None) or 0))
                    for name, p in self.module.named_parameters()]
        if isinstance(self.module, FullyShardedModel):
            slot = {ps.shard: ps for unit in self.module.units() for ps in unit.params}
            return [(p, Entry(name, p.data, "flat", shape=tuple(slot[p].shape)) if p in slot
                     else Entry(name, p.data))
                    for name, p in self.module.module.named_parameters()]
        return [(p, Entry(name, p.data)) for name, p in self.module.named_parameters()]

    def entries(self, init_optimizer: bool = False) -> list[Entry]:
        """Parameters and optimizer state (``optim.<name>.<state>``) under canonical names.

        ``init_optimizer=True`` first creates zero AdamW state where there is none
        (before the first step), so that a checkpoint can be loaded into it.
        """
        params = self.param_entries()
        out = [e for _, e in params]
        if isinstance(self.optimizer, ShardedOptimizer):     # the state lives on the shards
            outer = self.optimizer.param_groups[0]["params"]
            inner = self.optimizer.inner.param_groups[0]["params"]
            owner = dict(zip(outer, inner))
            state = self.optimizer.inner.state
            pairs = [(owner[p], Entry(e.key, owner[p].data, "flat", shape=tuple(p.shape)))
                     for p, e in params]
        else:
            state, pairs = self.optimizer.state, params
        for p, e in pairs:
            if init_optimizer and not state.get(p):
                state[p] = {"step": torch.zeros((), dtype=torch.float32),
                            "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
            for name, value in state.get(p, {}).items():
                kind = "full" if value.dim() == 0 else e.kind
                out.append(Entry(f"optim.{e.key}.{name}", value, kind, e.dim, e.shape))
        return out

