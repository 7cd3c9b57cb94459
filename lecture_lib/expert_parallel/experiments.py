"""What notebook 07 runs: MoE training equal to one process, drop rates, the layer timed.

* :func:`train_moe` (inside a rank, or ``group=LOCAL``) and
  :func:`train_expert_parallel` (launches the ranks): train :class:`MoEGPT`
  on :class:`models.MarkovText`, keeping the routing of every step.
* :func:`routing_stats`: what one forward routed, from the layer's ``"routing"``
  note (:mod:`lecture_lib.observe`); :func:`load_imbalance`: busiest expert over the mean.
* :func:`measure_drop_rates`: fraction of slots dropped against the capacity factor.
* :func:`layer_pass`: the rank function every timing runs, one layer's forward (and
  backward) watched phase by phase. :func:`benchmark_layer` runs it on real ranks
  (real seconds; :func:`benchmark_layer_sweep` for several world sizes), and
  :mod:`.emulated` at real size in the emulation's dry run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import comm, observe
from ..comm import LOCAL
from ..models import GPTConfig, MarkovText, TrainResult, lm_loss, make_optimizer, shard
from ..progress import progress
from ..runtime import device, run
from .layer import MoEGPT, MoELayer, sum_replicated_grads
from .router import FixedRouting, MoEConfig, check_moe, draw_choices

PHASES = ("route", "counts", "dispatch", "experts", "combine")


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
        with observe.watch() as seen:
            logits = model(x.to(dev))
        lm = lm_loss(logits, y.to(dev))
        model.objective(lm).backward()
        sum_replicated_grads(model.replicated_parameters(), group)
        opt.step()
        lm, aux = lm.detach() / size, model.summed_aux_loss().detach()
        comm.all_reduce_flat([lm], group, phase="loss")
        losses.append(float(lm + moe.aux_weight * aux))
        aux_history.append(float(aux))
        stats = [routing_stats(note) for note in seen.notes("routing")]    # one per layer
        per_expert.append(torch.stack([s["tokens_per_expert"] for s in stats]))
        dropped.append(torch.tensor([s["dropped_fraction"] for s in stats]))
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


def routing_sizes(note: dict) -> dict:
    """The numbers of one forward's ``"routing"`` note, plain integers (a dry run has them).

    ``tokens`` (global), ``capacity``, ``tokens_per_expert`` (before dropping) and
    ``kept_per_expert`` (global), ``dropped_fraction``, this rank's ``send_splits`` and
    ``recv_splits``, ``sent_bytes`` (to other ranks) and ``buffer_bytes`` (its send buffer).
    """
    a, plan, row_bytes = note["admission"], note["plan"], note["row_bytes"]
    k = len(a.counts_all[0])

    def per_expert(table):
        return [sum(t[j][e] for t in table for j in range(k)) for e in range(len(table[0][0]))]

    routed, kept, send = per_expert(a.counts_all), per_expert(a.kept_all), plan.send_splits
    return {"tokens": a.tokens, "capacity": a.capacity, "tokens_per_expert": routed,
            "kept_per_expert": kept,
            "dropped_fraction": 1.0 - sum(kept) / (k * a.tokens) if a.tokens else 0.0,
            "send_splits": send, "recv_splits": plan.recv_splits,
            "sent_bytes": (sum(send) - send[a.rank]) * row_bytes,
            "buffer_bytes": sum(send) * row_bytes}


def routing_stats(note: dict) -> dict:
    """:func:`routing_sizes` with the per-expert counts as tensors, and this rank's tokens:
    ``expert_index`` and ``gates`` (n, k), ``kept`` (n, k) bool; copies on the CPU."""
    routing, out = note["routing"], routing_sizes(note)
    for key in ("tokens_per_expert", "kept_per_expert"):
        out[key] = torch.tensor(out[key])
    return {**out, "expert_index": routing.expert.cpu(), "gates": routing.gates.detach().cpu(),
            "kept": note["admission"].keep.cpu()}


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
            with observe.watch() as seen:
                model(x)
            rates.append([routing_sizes(n)["dropped_fraction"] for n in seen.notes("routing")])
    return torch.tensor(rates)


def layer_pass(cfg: GPTConfig, moe: MoEConfig, tokens_per_rank: int, routing: dict | None = None,
               backward: bool = True, repeats: int = 1, warmup: int = 1,
               dtype: torch.dtype = torch.float32, seed: int = 0) -> dict:
    """One :class:`MoELayer` (``cfg``'s ``d_model``, ``d_ff`` and ``mlp``) on this rank,
    forward (and ``backward``), ``repeats`` times after ``warmup`` passes, watched.

    ``routing=None``: the learned router on random tokens (the global batch drawn from
    ``seed``, each rank its shard); else the keywords of :func:`~.router.draw_choices`
    (``seed``, ``skew``): a :class:`~.router.FixedRouting`, which the dry run needs.
    Returns ``seconds[phase]`` (mean over repeats; the five forward phases, and
    "backward"), ``comm_seconds[label]`` (the same for the collectives, by the label each
    carries: "counts", "dispatch", "combine", "backward"), ``spans`` of the last pass (phase,
    start, end), its ``comm`` calls (kind, label, buffer bytes, seconds), its ``step``
    ``(start, end)``, and its routing :func:`routing_sizes`.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number >= 1, not {repeats!r}")
    layer, x, upstream = _layer_and_tokens(cfg, moe, tokens_per_rank, routing, backward, dtype,
                                           seed)
    mean: dict[str, float] = {}
    with torch.set_grad_enabled(backward):
        for i in range(warmup + repeats):
            with observe.watch() as seen:
                with observe.span("step", x.device):
                    y = layer(x)
                    if backward:
                        with observe.span("backward", x.device):
                            y.backward(upstream)
            calls = [(f"comm:{s.data['phase']}", s.seconds) for s in seen.select("comm")]
            for name, seconds in list(seen.totals().items()) + calls:
                if i >= warmup:
                    mean[name] = mean.get(name, 0.0) + seconds / repeats
    step = seen.select("step")[0]
    return {"seconds": {p: mean[p] for p in PHASES + ("backward",) if p in mean},
            "comm_seconds": {p[5:]: t for p, t in mean.items() if p.startswith("comm:")},
            "spans": [(s.name, s.start, s.end) for s in seen.spans if s.name in PHASES],
            "comm": [(s.data["kind"], s.data["phase"], s.data["nbytes"], s.seconds)
                     for s in seen.select("comm")],
            "step": (step.start, step.end),
            "stats": routing_sizes(seen.notes("routing")[-1])}


def _layer_and_tokens(cfg, moe, tokens_per_rank, routing, backward, dtype, seed):
    """The layer (its routing fixed if asked), this rank's tokens and their upstream gradient."""
    _, rank, size = comm.resolve(None)
    layer = MoELayer(cfg.d_model, cfg.d_ff, moe.num_experts, moe.k, moe.capacity_factor,
                     seed=seed, mlp=cfg.mlp).to(dtype)
    if routing is not None:
        choices = draw_choices(tokens_per_rank * size, moe.num_experts, moe.k, **routing)
        layer.choose_experts = FixedRouting(np.split(choices, size), rank, moe.num_experts)
    g = torch.Generator().manual_seed(seed + 1)
    x_all = torch.randn(tokens_per_rank * size, cfg.d_model, generator=g, dtype=dtype)
    x = shard((x_all,), rank, size)[0].to(device()).requires_grad_(backward)
    return layer, x, torch.randn(x.shape, generator=g, dtype=dtype).to(x.device)


def benchmark_layer(world_size: int, tokens: int = 4096, d_model: int = 128, d_ff: int = 512,
                    num_experts: int = 8, k: int = 1, capacity_factor: float | None = 1.25,
                    repeats: int = 5, seed: int = 0, timeout: float = 180) -> list[dict]:
    """Time the phases of an MoE layer's forward on ``world_size`` real ranks (fixed global
    tokens, the learned router): per rank, :func:`layer_pass`'s ``seconds[phase]`` (phases
    "route", "counts", "dispatch", "experts", "combine"), the timeline ``spans`` of the last
    forward and the routing ``stats`` (split sizes, bytes sent to other ranks)."""
    _check_benchmark(world_size, tokens, num_experts, k, capacity_factor)
    cfg = GPTConfig(vocab_size=1, seq_len=1, d_model=d_model, n_heads=1, n_layers=1, d_ff=d_ff)
    return run(layer_pass, world_size, cfg, MoEConfig(num_experts, k, capacity_factor),
               tokens // world_size, None, False, repeats, 1, torch.float32, seed,
               timeout=timeout)


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
