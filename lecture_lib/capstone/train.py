"""The capstone trainer: one GPT, real tokens, any strategy, checkpoints, a failure survived.

One rank function, :func:`train_on_rank`, runs the same way from a notebook
(:func:`train`, through ``lecture_lib.run``) and from a shell
(``torchrun ... examples/train_gpt2.py``: :func:`.elastic.torchrun_main`, a process group
keyed by torchrun's restart generation and a watchdog; NCCL and ``cuda:<LOCAL_RANK>`` when
there is a GPU per process, gloo on the CPU). Every
strategy sees the same global batch in the same order (:mod:`.loader`), so its
loss curve is the one-process curve up to rounding.

Each step: this rank's shard of the global batch, forward and backward with the
strategy's communication (:mod:`.strategies`), optionally a simulated crash
(``fail_at``: ``SIGKILL`` of rank ``fail_rank`` between backward and the update,
once: a marker file in the checkpoint folder says it happened; :mod:`.elastic`), the update,
the global mean loss. Every ``log_every`` steps a progress line (none if ``quiet``): step, loss,
validation loss, tokens/s, MFU (:func:`lecture_lib.metrics.mfu`, against the
measured dense-matmul rate of the device unless ``peak_flops`` is given) and
memory per rank (CUDA's peak allocation; on the CPU the bytes of parameters,
gradients and optimizer state the rank holds). Every ``checkpoint_every`` steps
a checkpoint (:mod:`.checkpoint`); a run starts from the latest one it finds.
"""
from __future__ import annotations

import statistics
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from functools import partial

import torch
import torch.distributed as dist

from .. import emulate
from ..comm import record_comm
from ..context_parallel import shard_sequence
from ..dims import ParallelDims, Recipe
from ..mesh import RankGrid
from ..metrics import mfu, model_flops_per_token, time_kind, wall_time
from ..models import GPTConfig
from ..runtime import launch
from . import checkpoint, elastic
from .loader import TokenLoader, open_tokens
from .report import hardware, measured_peak_flops, non_embedding_params
from .strategies import STRATEGIES, Plan, check_strategy, run_recipe

__all__ = ["TrainConfig", "STRATEGIES", "PRECISIONS", "check_config", "train", "train_on_rank",
           "run_step", "cpu_gpt", "gpt2_small"]

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
"""How a step computes: fp32, or bf16 autocast (mixed precision: fp32 weights, gradients
and optimizer state; matrix multiplies and their activations in bf16)."""


def cpu_gpt(vocab_size: int) -> GPTConfig:
    """The course's small GPT for CPUs: trains visibly within minutes on 2 cores."""
    return GPTConfig(vocab_size=vocab_size, seq_len=64, d_model=128, n_heads=4, n_layers=4)


def gpt2_small(vocab_size: int) -> GPTConfig:
    """GPT-2 small's shape (Radford et al. 2019): 12 layers, d=768, 12 heads, context 1024."""
    return GPTConfig(vocab_size=vocab_size, seq_len=1024, d_model=768, n_heads=12, n_layers=12)


@dataclass(frozen=True)
class TrainConfig:
    model: GPTConfig
    tokens: object                       # a token file (path) or a 1-D integer array
    val_tokens: object = None
    strategy: str = "ddp"
    dims: ParallelDims = ParallelDims()  # the layout
    recipe: Recipe = Recipe()            # micro-batches, schedule (the ZeRO stage: the strategy's)
    precision: str = "fp32"              # or "bf16": autocast (PRECISIONS)
    global_batch: int = 8
    steps: int = 20
    lr: float = 1e-3
    seed: int = 0                        # the weights
    data_seed: int = 0                   # the order of the windows
    log_every: int = 10
    quiet: bool = False                  # no progress lines (the rows are still returned)
    val_batches: int = 2
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    fail_at: int | None = None
    fail_rank: int = 0
    record_comm: bool = False
    peak_flops: float | None = None
    emulate: str | None = None           # an emulation preset ("h100-node"): virtual time
    extra: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.dims.world_size


def check_config(cfg: TrainConfig, world_size: int | None = None) -> None:
    """Every check before a process starts: strategy, grid, data, checkpoint, failure."""
    if not isinstance(cfg.model, GPTConfig):
        raise TypeError(f"model must be a GPTConfig, not {type(cfg.model).__name__}")
    world = cfg.world_size if world_size is None else world_size
    check_strategy(cfg.strategy, cfg.model, cfg.dims, cfg.recipe, cfg.global_batch, world)
    if cfg.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, not {cfg.precision!r}")
    for name in ("steps", "log_every"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, not {getattr(cfg, name)}")
    TokenLoader(open_tokens(cfg.tokens), cfg.model.seq_len, cfg.global_batch)   # enough tokens
    if cfg.emulate is not None:
        emulate.preset(cfg.emulate)                  # an unknown preset: ValueError
        if cfg.checkpoint_dir or cfg.fail_at is not None:
            raise ValueError("emulate runs neither checkpoints nor failures: DCP's DTensor "
                             "collectives are not seen by the emulation (lecture_lib.emulate)")
    if cfg.checkpoint_every and not cfg.checkpoint_dir:
        raise ValueError("checkpoint_every needs a checkpoint_dir")
    elastic.check_failure(cfg.fail_at, cfg.fail_rank, world, cfg.checkpoint_dir,
                          cfg.checkpoint_every, cfg.steps)
    found = checkpoint.latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    if found is not None:
        meta = checkpoint.read_meta(found)
        checkpoint.check_same_model(meta, cfg.model, found)
        for key in ("global_batch", "data_seed"):
            if meta.get(key) != getattr(cfg, key):
                raise ValueError(f"the checkpoint in {found} was trained with {key}="
                                 f"{meta.get(key)}, this run has {getattr(cfg, key)}")


def train(cfg: TrainConfig, timeout: float = 600, **changes) -> dict:
    """Train on ``cfg.world_size`` ranks through ``lecture_lib.run``; rank 0's result."""
    cfg = replace(cfg, **changes) if changes else cfg
    check_config(cfg)
    return launch.run(train_on_rank, cfg.world_size, cfg, timeout=timeout)[0]


# ----------------------------------------------------------------------------
# Inside a rank
# ----------------------------------------------------------------------------

def _agreed(value: float) -> float:
    """The largest of every rank's ``value`` (one MFU denominator for the whole job)."""
    t = torch.tensor([value], dtype=torch.float64, device=launch.device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _peak(cfg: TrainConfig, dev: torch.device) -> tuple[float, str]:
    """MFU's denominator per device, and what it is."""
    if cfg.peak_flops:
        return cfg.peak_flops, f"the given peak, {cfg.peak_flops / 1e12:g} TFLOP/s"
    if cfg.emulate:
        rate = emulate.preset(cfg.emulate).flops(torch.float32)
        return rate, f"the emulated device's rate for fp32 ops, {rate / 1e12:g} TFLOP/s"
    rate = _agreed(measured_peak_flops(dev))
    return rate, f"a measured fp32 matmul, {rate / 1e12:.3g} TFLOP/s"


def _global_mean(local, plan: Plan) -> float:
    """The global batch's mean loss from the ranks that hold a share of it."""
    t = torch.zeros((), device=launch.device())
    if local is not None and plan.holds_loss():
        t += local.detach().float()
    dist.all_reduce(t)
    return t.item() / (plan.grid.size("dp") * plan.grid.size("cp"))


def _slice(batch, plan: Plan):
    """This rank's part of its dp shard: the cp slice of every sequence."""
    cp, layout = plan.rank.dims.cp, plan.rank.recipe.cp_layout
    if cp == 1:
        return batch
    return tuple(shard_sequence(t, plan.grid.coord("cp"), cp, layout) for t in batch)


def _validation(cfg: TrainConfig, plan: Plan, val: TokenLoader | None) -> float | None:
    if val is None or plan.grid.size("pp") > 1:
        return None
    losses = [_global_mean(plan.eval_loss(*_slice(val.batch(i), plan)), plan)
              for i in range(cfg.val_batches)]
    return sum(losses) / len(losses)


def _memory(plan: Plan) -> dict:
    dev = launch.device()
    held = plan.held()
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else sum(held.values())
    return {"peak_bytes": int(peak), "held": held}


def _setup(cfg: TrainConfig):
    grid = RankGrid.from_dims(cfg.dims)
    plan = Plan(cfg.strategy, cfg.model, cfg.dims, run_recipe(cfg.strategy, cfg.recipe), grid,
                cfg.lr, cfg.seed)
    dp, r = grid.size("dp"), grid.coord("dp")
    loader = TokenLoader(cfg.tokens, cfg.model.seq_len, cfg.global_batch, cfg.data_seed, r, dp)
    val = (TokenLoader(cfg.val_tokens, cfg.model.seq_len, cfg.global_batch, cfg.data_seed, r, dp)
           if cfg.val_tokens is not None else None)
    found = checkpoint.latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    if found is not None:
        checkpoint.load(found, plan, loader)
    return plan, loader, val, found


def _log_row(cfg, plan, step, loss, seconds, val, flops_tok, peak) -> dict:
    tokens_s = cfg.global_batch * cfg.model.seq_len / max(statistics.median(seconds), 1e-12)
    mem = [None] * dist.get_world_size()
    dist.all_gather_object(mem, _memory(plan))
    row = {"step": step, "loss": loss, "val_loss": _validation(cfg, plan, val),
           "tokens_per_s": tokens_s, "mfu": mfu(tokens_s, flops_tok, peak, cfg.world_size),
           "peak_bytes": [m["peak_bytes"] for m in mem], "held": [m["held"] for m in mem]}
    if dist.get_rank() == 0 and not cfg.quiet:
        v = "" if row["val_loss"] is None else f" | val {row['val_loss']:.4f}"
        memory = " ".join(f"{b / 2**20:.1f}" for b in row["peak_bytes"])
        print(f"step {step:5d} | loss {loss:.4f}{v} | {tokens_s:,.0f} tok/s | "
              f"MFU {row['mfu']:.2%} | MiB/rank {memory}", flush=True)
    return row


def _meta(cfg: TrainConfig) -> dict:
    return {"strategy": cfg.strategy, "world_size": cfg.world_size, "global_batch":
            cfg.global_batch, "data_seed": cfg.data_seed, "lr": cfg.lr,
            "grid": cfg.dims.sizes(), "recipe": cfg.recipe.label()}


def _comm_busy(clock) -> float:
    """Emulated seconds the communication stream has been busy so far (0 in real time)."""
    if clock is None:
        return 0.0
    clock.resolve()
    return clock.totals.get("comm", 0.0)


def _comm(log) -> dict:
    """What the recorder saw on this rank (None when it was off)."""
    if log is None:
        return {"comm_seconds": None, "comm_bytes": None, "comm_sent_bytes": None, "comm": None}
    return {"comm_seconds": log.seconds(), "comm_bytes": log.buffer_bytes(),
            "comm_sent_bytes": log.sent_bytes(), "comm": log.summary()}


def run_step(plan: Plan, x: torch.Tensor, y: torch.Tensor, precision: str = "fp32",
             between=None) -> torch.Tensor | None:
    """One training step of ``plan`` (the real run's and the prediction's): forward and
    backward with the gradients synchronised (under bf16 autocast for ``"bf16"``), then
    ``between()`` if given (a simulated crash), then the update; the local loss or None."""
    dtype = PRECISIONS[precision]
    with torch.autocast(launch.device().type, dtype=dtype, enabled=dtype is not None):
        local = plan.forward_backward(x, y)
    if between is not None:
        between()
    plan.update()
    return local


def train_on_rank(cfg: TrainConfig) -> dict:
    """The rank function (``lecture_lib.run`` or torchrun): train, log, checkpoint; a summary.

    With ``cfg.emulate`` the steps run in the virtual time of that preset
    (:mod:`lecture_lib.emulate`; the losses are the same bits), MFU is against the rate the
    preset charges, and ``comm_seconds`` is the communication stream's busy time.
    """
    plan, loader, val, found = _setup(cfg)
    dev = launch.device()
    peak, peak_kind = _peak(cfg, dev)
    flops_tok = model_flops_per_token(non_embedding_params(cfg.model), cfg.model.n_layers,
                                      cfg.model.seq_len, cfg.model.d_model)
    first, losses, seconds, rows, busy = loader.step, [], [], [], []
    with (emulate.emulated(cfg.emulate) if cfg.emulate else nullcontext()) as clock, \
            (record_comm() if cfg.record_comm else nullcontext()) as comm_log:
        kind = time_kind()
        for step in range(first, cfg.steps):
            elastic.watch(f"step {step} (forward, backward, the update and the loss's "
                          "all-reduce on every rank)")
            x, y = _slice(loader.next_batch(), plan)
            comm_before = _comm_busy(clock)
            with wall_time(dev) as t:
                local = run_step(plan, x, y, cfg.precision, partial(
                    elastic.maybe_fail, cfg.fail_at, cfg.fail_rank, cfg.checkpoint_dir, step))
            busy.append(_comm_busy(clock) - comm_before)
            losses.append(_global_mean(local, plan))
            seconds.append(t.seconds)
            last = step == cfg.steps - 1
            if (step + 1) % cfg.log_every == 0 or last:
                rows.append(_log_row(cfg, plan, step, losses[-1], seconds[-cfg.log_every:],
                                     val, flops_tok, peak))
            if cfg.checkpoint_every and ((step + 1) % cfg.checkpoint_every == 0 or last):
                elastic.watch(f"the checkpoint after step {step} (a collective save to "
                              f"{cfg.checkpoint_dir})")
                checkpoint.save(cfg.checkpoint_dir, step + 1, plan, loader, _meta(cfg))
    comm = _comm(comm_log)
    if clock is not None:
        comm["comm_seconds"] = sum(busy)
    timed = seconds[1:] or seconds
    return {"losses": losses, "first_step": first, "resumed_from": str(found) if found else None,
            "log": rows, "step_seconds": seconds, "peak_flops": peak,
            "tokens_per_s": cfg.global_batch * cfg.model.seq_len / statistics.median(timed)
            if timed else None,
            "val_losses": {r["step"]: r["val_loss"] for r in rows if r["val_loss"] is not None},
            **comm, "time_kind": kind, "peak": peak_kind, "hardware": hardware(dev),
            "memory_kind": "CUDA's peak allocation" if dev.type == "cuda" else
            "parameters + gradients + optimizer state held (CPU)",
            "strategy": cfg.strategy, "grid": _meta(cfg)["grid"], "model": asdict(cfg.model)}
