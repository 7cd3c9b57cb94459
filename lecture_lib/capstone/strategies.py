"""Every strategy of the course behind one interface, for the capstone trainer.

The capstone trains one GPT with each parallel scheme the pack teaches and
wires, rather than rewrites, the library's own pieces (the lesson of
:mod:`lecture_lib.hybrid`: each scheme communicates on its own axis of one
rank grid, Narayanan et al. 2021):

=========  ==============================================================  ===========
strategy   pieces                                                          grid
=========  ==============================================================  ===========
ddp        :class:`~lecture_lib.data_parallel.DDPFlat`, AdamW                dp
zero1      :class:`~lecture_lib.zero.ShardedOptimizer` (all-reduce)          dp
zero2      ``ShardedOptimizer(gradients="reduce_scatter")``                  dp
fsdp       :class:`~lecture_lib.zero.FullyShardedModel` (ZeRO-3)             dp
tp         :class:`~lecture_lib.tensor_parallel.ParallelBlock` s             tp (x dp)
pp         :class:`~lecture_lib.pipeline.PipelineExecutor`, 1F1B             pp (x dp)
cp         ring attention (:mod:`lecture_lib.context_parallel`)             cp (x dp)
3d         all of tp, pp, cp and dp together (:func:`lecture_lib.hybrid.build_stage`)
=========  ==============================================================  ===========

A :class:`Plan` is what a rank holds: ``forward_backward(x, y)`` (gradients
synchronised, the local loss or ``None`` on ranks that compute none),
``update()``, ``eval_loss(x, y)`` and ``entries()``: every parameter and optimizer
tensor under its *canonical* name (the one-process GPT's) with how this rank
holds it (:class:`Entry`), which is what :mod:`.checkpoint` saves and loads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..comm import collective
from ..context_parallel import sync_context_parallel_grads
from ..data_parallel import DDPFlat
from ..hybrid import HybridConfig, build_stage, check_hybrid
from ..launch import device
from ..mesh import RankGrid, grid_dims
from ..models import GPT, GPTConfig, lm_loss
from ..pipeline import PipelineExecutor, exchange, make_schedule
from ..zero import FullyShardedModel, ShardedOptimizer, fsdp_on_after_backward, held_bytes

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "tp", "pp", "cp", "3d")
DATA_PARALLEL_ONLY = ("ddp", "zero1", "zero2", "fsdp")
SHARDED = ("zero1", "zero2", "fsdp")       # the others run through the pipeline executor
OWN_AXIS = {"tp": "tp", "pp": "pp", "cp": "cp"}
WEIGHT_DECAY = 0.01                        # as lecture_lib.models.make_optimizer


def check_strategy(strategy: str, model: GPTConfig, world_size: int, dp: int = 1, tp: int = 1,
                   pp: int = 1, cp: int = 1, microbatches: int = 1, global_batch: int = 8,
                   schedule: str = "1f1b") -> None:
    """Every check that can be made before a process starts; a clear ValueError otherwise."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    sizes = {"dp": dp, "tp": tp, "pp": pp, "cp": cp}
    if strategy in DATA_PARALLEL_ONLY and (tp, pp, cp) != (1, 1, 1):
        raise ValueError(f"strategy {strategy} shards over data-parallel ranks only: give "
                         f"--dp, not tp={tp} pp={pp} cp={cp} (use 3d to combine them)")
    if strategy in OWN_AXIS:
        others = [k for k in ("tp", "pp", "cp") if k != strategy and sizes[k] != 1]
        if others:
            raise ValueError(f"strategy {strategy} combines only with dp, not with "
                             f"{', '.join(others)} (use 3d)")
    par = HybridConfig(dp, tp, pp, microbatches, schedule, cp=cp)
    check_hybrid(model, par, global_batch, world_size)


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

    def __init__(self, strategy: str, model: GPTConfig, grid: RankGrid, lr: float,
                 microbatches: int = 1, schedule: str = "1f1b", seed: int = 0):
        self.strategy, self.cfg, self.grid = strategy, model, grid
        self.microbatches = microbatches
        self.dp_group = grid.group("dp")
        self.pipelined = strategy not in SHARDED
        if self.pipelined:
            self._build_pipeline(lr, schedule, seed)
        else:
            self._build_sharded(lr, seed)

    # -- building -----------------------------------------------------------------

    def _build_pipeline(self, lr: float, schedule: str, seed: int) -> None:
        g = self.grid
        par = HybridConfig(g.size("dp"), g.size("tp"), g.size("pp"), self.microbatches, schedule,
                           cp=g.size("cp"))
        self.stage = build_stage(self.cfg, par, g, seed)
        self.module = self.stage
        self._activation_tail = (self.cfg.seq_len // g.size("cp"), self.cfg.d_model)
        self._schedule = make_schedule(schedule, g.size("pp"), self.microbatches)
        self.ddp = DDPFlat(self.stage, group=self.dp_group)
        self.optimizer = torch.optim.AdamW(self.stage.parameters(), lr=lr,
                                           weight_decay=WEIGHT_DECAY)
        self._executor = None

    def _build_sharded(self, lr: float, seed: int) -> None:
        gpt = GPT(self.cfg, seed).to(device())
        settings = {"lr": lr, "weight_decay": WEIGHT_DECAY}
        if self.strategy == "fsdp":
            self.module = FullyShardedModel(gpt, group=self.dp_group)
            self.optimizer = torch.optim.AdamW(self.module.parameters(), **settings)
        else:
            mode = "all_reduce" if self.strategy == "zero1" else "reduce_scatter"
            self.module = gpt
            self.optimizer = ShardedOptimizer(gpt.parameters(), torch.optim.AdamW,
                                              group=self.dp_group, gradients=mode, **settings)

    def _executor_for(self, local_batch: int) -> PipelineExecutor:
        shape = (local_batch // self.microbatches,) + tuple(self._activation_tail)
        if self._executor is None or self._executor.shape != shape:
            self._executor = PipelineExecutor(list(self.stage), self._schedule, shape,
                                              ranks=self.grid.ranks("pp"),
                                              group=self.grid.group("pp"),
                                              exchange=recorded_exchange)
        return self._executor

    # -- a step ---------------------------------------------------------------------

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """Gradients of this rank's batch, synchronised; the local mean loss (or None)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.pipelined:
            record = self._executor_for(x.shape[0]).step(x, y)
            self.ddp.finish_gradient_synchronization()
            if self.grid.size("cp") > 1:
                sync_context_parallel_grads(self.stage, self.grid.group("cp"))
            return None if record.loss is None else torch.tensor(record.loss, device=device())
        total = torch.zeros((), device=device())
        for xm, ym in zip(x.chunk(self.microbatches), y.chunk(self.microbatches)):
            loss = self.module(xm.to(device()), ym.to(device())) / self.microbatches
            loss.backward()
            total += loss.detach()
        if isinstance(self.module, FullyShardedModel):
            fsdp_on_after_backward(self.module, self.optimizer)
        return total

    def update(self) -> None:
        self.optimizer.step()

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """The local mean loss of a batch without training (None under pipelining: pp > 1)."""
        if self.pipelined:
            if self.grid.size("pp") > 1:
                return None
            return lm_loss(self.stage[0](x.to(device())), y.to(device()))
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
        if self.pipelined:
            return [(p, Entry(name.split(".", 1)[1], p.data,
                              "full" if getattr(p, "tp_dim", None) is None else "tp",
                              getattr(p, "tp_dim", None) or 0))
                    for name, p in self.stage.named_parameters()]
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


def recorded_exchange(sends, recvs, group=None) -> list:
    """The pipeline's :func:`~lecture_lib.pipeline.exchange`, counted by the comm recorder
    (kind ``"send"``, the bytes this rank sends; the time includes waiting for the receives)."""
    nbytes = sum(t.numel() * t.element_size() for t, _ in sends)
    size = len({peer for _, peer in list(sends) + list(recvs)}) + 1
    with collective("send", nbytes, size, "pipeline", device()):
        return exchange(sends, recvs, group)


def make_grid(dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1) -> RankGrid:
    """The rank grid of a run (inside a rank)."""
    return RankGrid(**grid_dims(dp=dp, pp=pp, cp=cp, tp=tp))
