"""What notebook 07 runs: MoE training equal to one process, drop rates, layer timings.

* :func:`train_moe` (inside a rank, or ``group=LOCAL``) and
  :func:`train_expert_parallel` (launches the ranks): train :class:`MoEGPT`
  on :class:`models.MarkovText`, keeping the routing of every step.
* :func:`load_imbalance`: busiest expert over the mean.
* :func:`measure_drop_rates`: fraction of slots dropped against the capacity factor.
* :func:`benchmark_layer`: the phases of one layer's forward timed on real ranks
  (the layer's opt-in :class:`metrics.Timer`), with its split sizes and bytes;
  :func:`benchmark_layer_sweep` does it for several world sizes, with progress.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import comm
from ..comm import LOCAL
from ..metrics import Timer
from ..models import GPTConfig, MarkovText, TrainResult, make_optimizer, shard
from ..progress import progress
from ..runtime import device, run
from .layer import MoEGPT, MoELayer, sum_replicated_grads
from .router import MoEConfig, check_moe


@dataclass
class MoETrainResult(TrainResult):
    """Losses and parameters, plus the routing of every step.

    ``tokens_per_expert[step, layer, e]``: global token slots routed to ``e``
    (before dropping); ``dropped[step, layer]``: fraction of slots dropped;
    ``aux[step]``: the summed aux loss.
    """
    tokens_per_expert: torch.Tensor | None = None
    dropped: torch.Tensor | None = None
    aux: list[float] | None = None


def train_moe(cfg: GPTConfig, moe: MoEConfig, steps: int, batch_size: int, lr: float = 1e-2,
              seed: int = 0, data_seed: int = 0, group=None,
              optimizer: str = "adamw") -> MoETrainResult:
    """Train :class:`MoEGPT` on :class:`models.MarkovText` in this process (a rank or LOCAL).

    Each rank of ``group`` takes its shard of global batch ``step``; returns the
    global losses, this rank's parameters (replicated ones and its experts,
    under their one-process names) and the routing history.
    """
    _, rank, size = comm.resolve(group)
    model = MoEGPT(cfg, moe, seed, group)
    opt = make_optimizer(model.parameters(), optimizer, lr)
    data = MarkovText(cfg.vocab_size, cfg.seq_len, seed=data_seed)
    dev = model.head.weight.device
    losses, aux_history, per_expert, dropped = [], [], [], []
    for step in range(steps):
        x, y = shard(data.batch(step, batch_size), rank, size)
        opt.zero_grad(set_to_none=True)
        model(x.to(dev), y.to(dev)).backward()
        sum_replicated_grads(model.replicated_parameters(), group)
        opt.step()
        lm = model.last_lm / size
        comm.all_reduce_flat([lm], group, phase="loss")
        losses.append(float(lm + moe.aux_weight * model.last_aux))
        aux_history.append(float(model.last_aux))
        per_expert.append(torch.stack([m.stats["tokens_per_expert"] for m in model.moe_layers()]))
        dropped.append(torch.tensor([m.stats["dropped_fraction"] for m in model.moe_layers()]))
    params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    return MoETrainResult(losses, params, torch.stack(per_expert), torch.stack(dropped),
                          aux_history)


def train_expert_parallel(cfg: GPTConfig, moe: MoEConfig, world_size: int, steps: int,
                          batch_size: int, lr: float = 1e-2, seed: int = 0, data_seed: int = 0,
                          optimizer: str = "adamw", timeout: float = 180) -> MoETrainResult:
    """Train on ``world_size`` expert-parallel ranks; gather the full parameter set.

    Checks the configuration first (experts divisible by ranks, batch by
    ranks), then runs :func:`train_moe` on every rank. The result holds every
    parameter under its one-process name, comparable with
    ``models.train_reference(MoEGPT(cfg, moe, seed, group=LOCAL), ...)``.
    """
    check_moe(moe.num_experts, moe.k, moe.capacity_factor, world_size)
    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} is not divisible by {world_size} ranks")
    results = run(train_moe, world_size, cfg, moe, steps, batch_size, lr, seed, data_seed,
                  None, optimizer, timeout=timeout)
    params = {}
    for r in results:
        for name, value in r.params.items():
            if name in params and ".experts." not in name and not torch.equal(params[name], value):
                raise AssertionError(f"replicated parameter {name} differs between ranks")
            params[name] = value
    first = results[0]
    return MoETrainResult(first.losses, params, first.tokens_per_expert, first.dropped,
                          first.aux)


def load_imbalance(tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """Max over mean tokens per expert (1 = even; E = all on one expert), on the last dim."""
    t = tokens_per_expert.double()
    return t.max(-1).values / t.mean(-1)


def measure_drop_rates(cfg: GPTConfig, moe: MoEConfig, params: dict, capacity_factors,
                       batch_size: int = 32, data_seed: int = 0,
                       step: int = 10_000) -> torch.Tensor:
    """Fraction of token slots dropped, ``[factor, layer]``, by a trained :class:`MoEGPT`.

    Loads ``params`` into the one-process model (equal to expert parallel, tested)
    and runs one held-out batch forward at each capacity factor.
    """
    for cf in capacity_factors:
        check_moe(moe.num_experts, moe.k, cf)
    model = MoEGPT(cfg, moe, group=LOCAL)
    model.load_state_dict(params)
    x, _ = MarkovText(cfg.vocab_size, cfg.seq_len, seed=data_seed).batch(step, batch_size)
    rates = []
    with torch.no_grad():
        for cf in capacity_factors:
            for layer in model.moe_layers():
                layer.capacity_factor = cf
            model(x)
            rates.append([layer.stats["dropped_fraction"] for layer in model.moe_layers()])
    return torch.tensor(rates)


def _benchmark_rank(tokens, d_model, d_ff, num_experts, k, capacity_factor, repeats, seed):
    rank, size = comm.group_info()
    dev = device()
    layer = MoELayer(d_model, d_ff, num_experts, k, capacity_factor, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    x_all = torch.randn(tokens, d_model, generator=g)
    x = shard((x_all,), rank, size)[0].to(dev)
    with torch.no_grad():
        layer(x)                                             # warm-up
        layer.timer = Timer(dev)
        for _ in range(repeats):
            layer(x)
    stats = {key: layer.stats[key] for key in ("send_splits", "recv_splits", "sent_bytes",
                                               "buffer_bytes", "dropped_fraction", "tokens")}
    return {"seconds": {p: t / repeats for p, t in layer.timer.totals.items()},
            "spans": layer.timer.spans[-len(layer.timer.spans) // repeats:], "stats": stats}


def benchmark_layer(world_size: int, tokens: int = 4096, d_model: int = 128, d_ff: int = 512,
                    num_experts: int = 8, k: int = 1, capacity_factor: float | None = 1.25,
                    repeats: int = 5, seed: int = 0, timeout: float = 180) -> list[dict]:
    """Time the phases of an MoE layer's forward on ``world_size`` ranks (fixed global tokens).

    Per rank: ``seconds[phase]`` (mean over ``repeats``; phases "route", "counts",
    "dispatch", "experts", "combine"), the timeline ``spans`` of the last forward
    and the routing ``stats`` (split sizes, bytes sent to other ranks).
    """
    _check_benchmark(world_size, tokens, num_experts, k, capacity_factor)
    return run(_benchmark_rank, world_size, tokens, d_model, d_ff, num_experts, k,
               capacity_factor, repeats, seed, timeout=timeout)


def _check_benchmark(world_size, tokens, num_experts, k, capacity_factor) -> None:
    check_moe(num_experts, k, capacity_factor, world_size)
    if tokens % world_size:
        raise ValueError(f"tokens={tokens} is not divisible by {world_size} ranks")


def benchmark_layer_sweep(world_sizes, tokens: int = 4096, d_model: int = 128,
                          d_ff: int = 512, num_experts: int = 8, k: int = 1,
                          capacity_factor: float | None = 1.25, repeats: int = 5, seed: int = 0,
                          timeout: float = 180) -> dict[int, list[dict]]:
    """``{p: benchmark_layer(p, ...)}`` for each ``p`` of ``world_sizes`` (all checked
    first), one call of the ranks each, with :func:`~lecture_lib.progress.progress`."""
    world_sizes = list(world_sizes)
    for p in world_sizes:
        _check_benchmark(p, tokens, num_experts, k, capacity_factor)
    return {p: benchmark_layer(p, tokens, d_model, d_ff, num_experts, k, capacity_factor,
                               repeats, seed, timeout)
            for p in progress(world_sizes, "MoE layer benchmark: one world size each")}
