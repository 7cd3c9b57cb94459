"""Expert parallelism: a mixture of experts whose experts live on different ranks.

The idea
--------
A mixture-of-experts (MoE) layer replaces a transformer's MLP by ``E`` MLPs,
the *experts*, and a *router* (a linear map ``d -> E``) that picks, for each
token, the ``k`` experts it goes through (Shazeer et al. 2017; Switch
Transformer, Fedus, Zoph & Shazeer 2021, takes ``k = 1``; GShard, Lepikhin et
al. 2020, ``k = 2``). Parameters grow with ``E``, the work per token only
with ``k``.

Expert parallelism puts ``E / p`` experts on each of ``p`` ranks. Every rank
routes its own tokens, then one all-to-all sends each token to the rank that
holds its expert ("dispatch"), the experts run, and a second all-to-all
brings the results home ("combine"), where they are weighted by their gates
and summed. The number of tokens a rank sends to each other rank varies
from batch to batch, so the all-to-alls use per-rank split sizes
(``all_to_all_single(out, in, output_split_sizes, input_split_sizes)``), and
those sizes must be known on both ends *before* the tokens move: the ranks
exchange their per-expert counts first.

Routing, as in Switch / GShard:

* gates: ``softmax(router(x))``; the top ``k`` experts of each token; with
  ``k = 1`` the gate is that expert's probability (Switch), with ``k > 1``
  the top-k probabilities renormalised to sum to 1 (GShard, Mixtral).
* capacity: each expert takes at most ``C = ceil(capacity_factor * k * T / E)``
  token slots, where **T is the global number of tokens** (all ranks of the
  expert-parallel group together; Switch section 2.2 computes it from the
  tokens of the batch). Slots are filled in one global priority order: first
  choices before second choices (GShard), then by rank, then by position on
  the rank. A slot past ``C`` is *dropped*: that expert contributes nothing
  and the residual connection carries the token on. Because ``C`` and the
  order are global, the same tokens are dropped whatever the number of ranks.
  ``capacity_factor=None`` drops nothing.
* the load-balancing loss (Switch, eq. 4): ``aux = E * sum_e f_e * P_e``
  with ``f_e`` the fraction of token slots routed to ``e`` (before dropping;
  over all ``k`` choices) and ``P_e`` the mean router probability of ``e``,
  both over the global batch. It is 1 when routing is even and grows to ``E``
  when every token picks one expert.

Why the counts are all-gathered, not all-to-all'ed: to know which of its
tokens fit, a rank needs how many tokens the ranks *before* it sent to each
expert (its place in the global order). One all-gather of the ``(k, E)``
count table gives every rank the whole table, from which it reads both its
send and its receive split sizes and the global load-balancing statistics.

Equal to one process: the same layer with every expert local
(``group=LOCAL``, or one rank) is the reference. On ``p`` ranks, each rank
holding ``1/p`` of the tokens, the outputs, the aux loss, the dropped tokens,
the input and expert gradients, and the router gradient summed over ranks
equal the reference's (tests: rtol 1e-5).

Losses on ranks: :class:`MoEGPT` returns this rank's *share* of the global
objective, ``lm_loss / p + aux_weight * aux``, where ``aux`` carries the
global value but the gradient of this rank's tokens only; summing the
gradients of replicated parameters over the ranks then gives the gradient of
the one-process loss exactly, and expert gradients need no reduction at all
(the combine all-to-all's backward already brings every token's gradient to
its expert).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .launch import device, run
from .metrics import Timer
from .models import (GPT, MLP, GPTConfig, MarkovText, TrainResult, init_weights, lm_loss,
                     make_optimizer, shard)

LOCAL = "local"
"""``group=LOCAL``: all experts in this process, no communication (the reference)."""


# ----------------------------------------------------------------------------
# Configuration and its checks (before any process starts)
# ----------------------------------------------------------------------------

def check_moe(num_experts: int, k: int = 1, capacity_factor: float | None = 1.25,
              world_size: int = 1) -> None:
    """Clear error for a configuration that cannot work, before any rank starts."""
    for name, v in (("num_experts", num_experts), ("k", k), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
    if k > num_experts:
        raise ValueError(f"k={k} is larger than the number of experts ({num_experts}): "
                         "a token cannot choose more experts than there are")
    if capacity_factor is not None and (isinstance(capacity_factor, bool) or
                                        not isinstance(capacity_factor, (int, float)) or
                                        not capacity_factor > 0):
        raise ValueError(f"capacity_factor must be a number > 0 (or None: no dropping), "
                         f"not {capacity_factor!r}")
    if num_experts % world_size:
        raise ValueError(f"{num_experts} experts cannot be spread evenly over {world_size} "
                         f"expert-parallel ranks: num_experts must be divisible by the ranks")


@dataclass(frozen=True)
class MoEConfig:
    """An MoE layer: ``num_experts`` experts, top-``k`` routing, capacity, aux-loss weight.

    ``aux_weight`` 0.01 is Switch's choice (alpha, section 2.2).
    """
    num_experts: int = 8
    k: int = 1
    capacity_factor: float | None = 1.25
    aux_weight: float = 0.01

    def __post_init__(self):
        check_moe(self.num_experts, self.k, self.capacity_factor)
        if not self.aux_weight >= 0:
            raise ValueError(f"aux_weight must be >= 0, not {self.aux_weight!r}")


def expert_capacity(tokens: int, num_experts: int, k: int = 1,
                    capacity_factor: float | None = 1.25) -> int | None:
    """Token slots per expert: ``ceil(capacity_factor * k * tokens / num_experts)``."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * k * tokens / num_experts)


# ----------------------------------------------------------------------------
# The all-to-all, differentiable
# ----------------------------------------------------------------------------

def _resolve(group):
    """(process group or None, size, rank within it); LOCAL or no dist: one process."""
    if group == LOCAL or (group is None and not dist.is_initialized()):
        return None, 1, 0
    return group, dist.get_world_size(group), dist.get_rank(group)


def _all_to_all_raw(x, send_splits, recv_splits, group):
    out = x.new_empty((sum(recv_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Forward: rows ``send_splits[r]`` go to rank r. Backward: the same exchange reversed."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        return _all_to_all_raw(x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        return _all_to_all_raw(grad, recv_splits, send_splits, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, send_splits: list[int], recv_splits: list[int],
               group=None) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` on dim 0 with per-rank split sizes.

    ``x`` holds ``send_splits[r]`` rows for rank r, in rank order; the result
    holds ``recv_splits[r]`` rows from rank r. Gradients travel back the same
    way. With one rank (or ``group=LOCAL``) it returns ``x``.
    """
    group, size, _ = _resolve(group)
    if len(send_splits) != size or len(recv_splits) != size:
        raise ValueError(f"need one split size per rank ({size}), got {len(send_splits)} "
                         f"to send and {len(recv_splits)} to receive")
    if sum(send_splits) != x.shape[0]:
        raise ValueError(f"send splits {send_splits} add up to {sum(send_splits)}, "
                         f"but x has {x.shape[0]} rows")
    if size == 1:
        return x
    return _AllToAll.apply(x, list(send_splits), list(recv_splits), group)


def _all_gather_rows(t: torch.Tensor, group, size: int) -> torch.Tensor:
    """(size, *t.shape): every rank's ``t``, in rank order."""
    if size == 1:
        return t.unsqueeze(0)
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.stack(parts)


# ----------------------------------------------------------------------------
# The MoE layer
# ----------------------------------------------------------------------------

class MoELayer(nn.Module):
    """Router + ``num_experts`` MLPs spread over the ranks of ``group``.

    ``MoELayer(d_model, d_ff, num_experts, k, capacity_factor, group, seed)``;
    ``forward(x)`` takes ``(..., d_model)`` and returns the same shape. After a
    forward, ``layer.aux_loss`` is the load-balancing loss (global value,
    gradient through this rank's tokens) and ``layer.stats`` the routing
    (global tokens per expert, kept slots, capacity, bytes sent...).
    Weights come from ``seed`` through :func:`models.init_weights` on the full
    set of experts, then each rank keeps its own, so every world size starts
    from the same weights. Experts are kept in ``self.experts[str(e)]`` under
    their *global* index, so parameter names match the one-process layer.
    Set ``layer.timer = metrics.Timer(...)`` to time the phases of forward:
    "route", "counts" (all-gather of counts), "dispatch" (all-to-all),
    "experts", "combine" (all-to-all back).
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, k: int = 1,
                 capacity_factor: float | None = 1.25, group=None, seed: int | None = 0):
        super().__init__()
        check_moe(num_experts, k, capacity_factor)
        self.d_model, self.num_experts, self.k = d_model, num_experts, k
        self.capacity_factor = capacity_factor
        self.router = nn.Linear(d_model, num_experts, bias=False)
        cfg = GPTConfig(vocab_size=1, seq_len=1, d_model=d_model, n_heads=1, n_layers=1, d_ff=d_ff)
        self.experts = nn.ModuleDict({str(e): MLP(cfg) for e in range(num_experts)})
        self.timer: Timer | None = None
        self.aux_loss: torch.Tensor | None = None
        self.stats: dict = {}
        if seed is not None:
            init_weights(self, seed)
        self.place_experts(group)

    def place_experts(self, group) -> None:
        """Keep only this rank's experts: rank r of p holds ``[r E/p, (r+1) E/p)``."""
        self.group, self.ep_size, self.ep_rank = _resolve(group)
        check_moe(self.num_experts, self.k, self.capacity_factor, self.ep_size)
        self.local_experts = self.num_experts // self.ep_size
        first = self.ep_rank * self.local_experts
        self.expert_ids = list(range(first, first + self.local_experts))
        for e in list(self.experts):
            if int(e) not in self.expert_ids:
                del self.experts[e]
        if group != LOCAL and dist.is_initialized():
            self.to(device())                    # cuda:<local rank> under NCCL

    def _phase(self, name):
        return self.timer(name) if self.timer is not None else contextlib.nullcontext()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        n, E, k, p = x.shape[0], self.num_experts, self.k, self.ep_size

        with self._phase("route"):
            probs = torch.softmax(self.router(x).float(), dim=-1)          # (n, E)
            top_p, top_e = probs.topk(k, dim=-1)                            # (n, k)
            gates = top_p if k == 1 else top_p / top_p.sum(-1, keepdim=True)
            onehot = F.one_hot(top_e, E)                                    # (n, k, E)
            counts = onehot.sum(0)                                          # (k, E)
            message = torch.cat([counts.double().flatten(), probs.detach().double().sum(0)])

        # 1. exchange counts: every rank learns every rank's (k, E) table
        with self._phase("counts"):
            table = _all_gather_rows(message, self.group, p)                # (p, kE + E)
        counts_all = table[:, :k * E].round().long().view(p, k, E)
        tokens = int(counts_all[:, 0].sum())                                # global T

        # 2. capacity: global position of each slot in (choice, rank, token) order
        with self._phase("route"):
            totals = counts_all.sum(0)                                      # (k, E)
            before_slot = totals.cumsum(0) - totals
            before_rank = counts_all.cumsum(0) - counts_all                 # (p, k, E)
            start = before_slot.unsqueeze(0) + before_rank
            capacity = expert_capacity(tokens, E, k, self.capacity_factor)
            if capacity is None:
                kept_all = counts_all
                keep = torch.ones(n, k, dtype=torch.bool, device=x.device)
            else:
                kept_all = (capacity - start).clamp(min=0).minimum(counts_all)
                rank_in_slot = (onehot.cumsum(0) * onehot).sum(-1) - 1       # (n, k)
                mine = start[self.ep_rank].gather(1, top_e.T).T              # (n, k)
                keep = (mine + rank_in_slot) < capacity

            # the aux loss: global value, gradient through this rank's tokens
            f = counts_all.sum((0, 1)).to(probs.dtype) / (k * tokens)
            local_sum = probs.sum(0)
            global_sum = table[:, k * E:].sum(0).to(probs.dtype)
            P = (local_sum + (global_sum - local_sum.detach())) / tokens
            self.aux_loss = E * (f * P).sum()

            # 3. the send buffer: kept slots sorted by expert (so by destination rank)
            slot_expert = top_e.T.reshape(-1)                               # slot-major
            kept_slots = keep.T.reshape(-1).nonzero().squeeze(1)
            order = kept_slots[slot_expert[kept_slots].argsort(stable=True)]
            token_of = order % n
            per_expert = torch.bincount(slot_expert[order], minlength=E)
            send_splits = per_expert.view(p, -1).sum(1).tolist()
            recv_per = kept_all[:, :, self.expert_ids].sum(1)               # (p, E/p)
            recv_splits = recv_per.sum(1).tolist()
            send_buffer = x[token_of]

        with self._phase("dispatch"):
            received = all_to_all(send_buffer, send_splits, recv_splits, self.group)

        with self._phase("experts"):
            local = torch.arange(self.local_experts, device=x.device).repeat(p)
            row_expert = local.repeat_interleave(recv_per.flatten().to(x.device))
            by_expert = row_expert.argsort(stable=True)
            chunks = received[by_expert].split(recv_per.sum(0).tolist())
            done = torch.cat([self.experts[str(e)](c) for e, c in zip(self.expert_ids, chunks)])
            processed = done[by_expert.argsort()]

        with self._phase("combine"):
            back = all_to_all(processed, recv_splits, send_splits, self.group)
        with self._phase("route"):
            weight = gates.T.reshape(-1)[order].unsqueeze(1).to(x.dtype)
            y = torch.zeros_like(x).index_add(0, token_of, back * weight)

        element = x.element_size() * self.d_model
        self.stats = {
            "tokens": tokens, "capacity": capacity,
            "tokens_per_expert": counts_all.sum((0, 1)).cpu(),             # before dropping
            "kept_per_expert": kept_all.sum((0, 1)).cpu(),
            "dropped_fraction": 1.0 - float(kept_all.sum()) / (k * tokens) if tokens else 0.0,
            "expert_index": top_e.detach().cpu(), "gates": gates.detach().cpu(),
            "kept": keep.cpu(), "send_splits": send_splits, "recv_splits": recv_splits,
            "sent_bytes": (sum(send_splits) - send_splits[self.ep_rank]) * element,
            "buffer_bytes": sum(send_splits) * element,
        }
        return y.reshape(shape)


# ----------------------------------------------------------------------------
# The small GPT with MoE blocks
# ----------------------------------------------------------------------------

class MoEGPT(GPT):
    """:class:`models.GPT` whose every block's MLP is an :class:`MoELayer`.

    ``model(idx)`` gives logits; ``model(idx, targets)`` gives this rank's
    share of the objective, ``lm_loss / p + aux_weight * sum of aux losses``
    (the plain loss on one process), and keeps ``model.last_lm`` and
    ``model.last_aux`` (detached). All weights come from ``seed``.
    """

    def __init__(self, cfg: GPTConfig = GPTConfig(), moe: MoEConfig = MoEConfig(),
                 seed: int = 0, group=None):
        super().__init__(cfg, seed)
        self.moe = moe
        for block in self.blocks:
            block.mlp = MoELayer(cfg.d_model, cfg.d_ff, moe.num_experts, moe.k,
                                 moe.capacity_factor, group=LOCAL, seed=None)
        init_weights(self, seed)                # the whole model, every expert, one generator
        for layer in self.moe_layers():
            layer.place_experts(group)
        self.ep_size = self.moe_layers()[0].ep_size
        self.to(self.moe_layers()[0].router.weight.device)

    def moe_layers(self) -> list[MoELayer]:
        return [block.mlp for block in self.blocks]

    def expert_parameters(self) -> list[nn.Parameter]:
        return [p for layer in self.moe_layers() for p in layer.experts.parameters()]

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Every parameter that each rank holds a copy of (gradients summed over ranks)."""
        experts = {id(p) for p in self.expert_parameters()}
        return [p for p in self.parameters() if id(p) not in experts]

    def forward(self, idx, targets=None):
        logits = super().forward(idx)
        if targets is None:
            return logits
        lm = lm_loss(logits, targets)
        aux = sum(layer.aux_loss for layer in self.moe_layers())
        self.last_lm, self.last_aux = lm.detach(), aux.detach()
        return lm / self.ep_size + self.moe.aux_weight * aux


def sum_replicated_grads(params, group=None) -> None:
    """All-reduce (sum) the gradients of replicated parameters, in one flat buffer."""
    group, size, _ = _resolve(group)
    if size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


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
    g, size, rank = _resolve(group)
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
        if size > 1:
            dist.all_reduce(lm, group=g)
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


# ----------------------------------------------------------------------------
# Measurements for the notebook
# ----------------------------------------------------------------------------

def measure_drop_rates(cfg: GPTConfig, moe: MoEConfig, params: dict, capacity_factors,
                       batch_size: int = 32, data_seed: int = 0, step: int = 10_000) -> torch.Tensor:
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
    _, size, rank = _resolve(None)
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
    check_moe(num_experts, k, capacity_factor, world_size)
    if tokens % world_size:
        raise ValueError(f"tokens={tokens} is not divisible by {world_size} ranks")
    return run(_benchmark_rank, world_size, tokens, d_model, d_ff, num_experts, k,
               capacity_factor, repeats, seed, timeout=timeout)
