"""Routing a mixture of experts: top-k gates, capacity, the load-balancing loss.

A mixture-of-experts (MoE) layer replaces a transformer's MLP by ``E`` MLPs,
the *experts*, and a *router* (a linear map ``d -> E``) that picks, for each
token, the ``k`` experts it goes through (Shazeer et al. 2017; Switch
Transformer, Fedus, Zoph & Shazeer 2021, takes ``k = 1``; GShard, Lepikhin
et al. 2020, ``k = 2``). Parameters grow with ``E``, the work per token only
with ``k``.

* gates: ``softmax(router(x))``; the top ``k`` experts of each token; with
  ``k = 1`` the gate is that expert's probability (Switch), with ``k > 1``
  the top-k probabilities renormalised to sum to 1 (GShard, Mixtral).
* capacity: each expert takes at most ``C = ceil(capacity_factor * k * T / E)``
  token slots, where **T is the global number of tokens** (all ranks of the
  expert-parallel group together; Switch section 2.2). Slots are filled in
  one global priority order: first choices before second choices (GShard),
  then by rank, then by position on the rank. A slot past ``C`` is
  *dropped*: that expert contributes nothing and the residual connection
  carries the token on. Because ``C`` and the order are global, the same
  tokens are dropped whatever the number of ranks. ``capacity_factor=None``
  drops nothing.
* the load-balancing loss (Switch, eq. 4): ``aux = E * sum_e f_e * P_e``
  with ``f_e`` the fraction of token slots routed to ``e`` (before dropping;
  over all ``k`` choices) and ``P_e`` the mean router probability of ``e``,
  both over the global batch. It is 1 when routing is even and grows to
  ``E`` when every token picks one expert.

The global quantities come from every rank's ``(k, E)`` count table
(:func:`.dispatch.exchange_counts`); this file only computes with them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


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


@dataclass
class Routing:
    """This rank's tokens routed: ``n`` tokens, ``E`` experts, ``k`` choices each."""
    probs: torch.Tensor       # (n, E) router probabilities (float32)
    expert: torch.Tensor      # (n, k) the chosen experts, best first
    gates: torch.Tensor       # (n, k) their weights
    onehot: torch.Tensor      # (n, k, E)
    counts: torch.Tensor      # (k, E) tokens whose j-th choice is e


def top_k_route(logits: torch.Tensor, k: int) -> Routing:
    """Softmax, top-k, gates (renormalised when ``k > 1``), and the count table."""
    probs = torch.softmax(logits.float(), dim=-1)
    top_p, top_e = probs.topk(k, dim=-1)
    gates = top_p if k == 1 else top_p / top_p.sum(-1, keepdim=True)
    onehot = F.one_hot(top_e, probs.shape[-1])
    return Routing(probs, top_e, gates, onehot, onehot.sum(0))


@dataclass
class Admission:
    """Which slots fit: ``keep`` (n, k) on this rank, ``kept_all`` (p, k, E) on every rank."""
    tokens: int                  # global T
    capacity: int | None
    counts_all: torch.Tensor     # (p, k, E) slots routed, before dropping
    kept_all: torch.Tensor       # (p, k, E) slots kept
    keep: torch.Tensor           # (n, k) bool


def admit(routing: Routing, counts_all: torch.Tensor, rank: int,
          capacity_factor: float | None) -> Admission:
    """Fill each expert's ``C`` slots in the global (choice, rank, token) order."""
    num_experts, k = counts_all.shape[2], counts_all.shape[1]
    tokens = int(counts_all[:, 0].sum())
    capacity = expert_capacity(tokens, num_experts, k, capacity_factor)
    if capacity is None:
        keep = torch.ones(routing.expert.shape, dtype=torch.bool, device=routing.expert.device)
        return Admission(tokens, None, counts_all, counts_all, keep)
    totals = counts_all.sum(0)                                      # (k, E)
    before_slot = totals.cumsum(0) - totals                         # earlier choices, all ranks
    before_rank = counts_all.cumsum(0) - counts_all                 # same choice, earlier ranks
    start = before_slot.unsqueeze(0) + before_rank                  # (p, k, E)
    kept_all = (capacity - start).clamp(min=0).minimum(counts_all)
    onehot = routing.onehot
    rank_in_slot = (onehot.cumsum(0) * onehot).sum(-1) - 1          # (n, k) earlier tokens here
    mine = start[rank].gather(1, routing.expert.T).T                # (n, k)
    keep = (mine + rank_in_slot) < capacity
    return Admission(tokens, capacity, counts_all, kept_all, keep)


def load_balancing_loss(probs: torch.Tensor, counts_all: torch.Tensor,
                        global_prob_sum: torch.Tensor, tokens: int) -> torch.Tensor:
    """Switch's ``E sum_e f_e P_e``: the global value, the gradient through this rank's tokens."""
    num_experts, k = probs.shape[-1], counts_all.shape[1]
    f = counts_all.sum((0, 1)).to(probs.dtype) / (k * tokens)
    local_sum = probs.sum(0)
    P = (local_sum + (global_prob_sum.to(probs.dtype) - local_sum.detach())) / tokens
    return num_experts * (f * P).sum()
