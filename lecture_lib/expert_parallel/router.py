"""Routing a mixture of experts: top-k gates, capacity in one global order, the aux loss.

An MoE layer replaces a transformer's MLP by ``E`` MLPs, the *experts*, and a *router*
(a linear map ``d -> E``) that sends each token through ``k`` of them (Shazeer et al. 2017;
Switch Transformer, Fedus, Zoph & Shazeer 2021, ``k = 1``; GShard, Lepikhin et al. 2020,
``k = 2``): parameters grow with ``E``, the work per token only with ``k``::

    token --router--> softmax over E experts --top-k--> e1, e2 with gates g1 + g2 = 1
    output = g1 * expert_e1(token) + g2 * expert_e2(token)

* capacity: each expert takes at most ``C = ceil(capacity_factor * k * T / E)`` slots,
  ``T`` the tokens of *all* ranks (Switch 2.2), filled in one global order: first choices
  before second choices (GShard), then by rank, then by position. A slot past ``C`` is
  dropped (the residual carries the token on), the same slots on any number of ranks.
* the load-balancing loss (Switch, eq. 4): ``E * sum_e f_e * P_e``, ``f_e`` the fraction of
  slots routed to ``e`` and ``P_e`` its mean probability: 1 when even, ``E`` when collapsed.

The global numbers come from every rank's ``(k, E)`` count table, held on the host as
integers (:func:`.dispatch.exchange_counts`). :class:`FixedRouting` decides the experts
before the step (torchtitan's ``debug_moe_force_load_balance`` does so for benchmarks):
the table is then known without reading a tensor, as a dry run on fake tensors needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Routing:
    """This rank's ``n`` tokens routed to ``k`` of ``E`` experts each."""
    probs: torch.Tensor       # (n, E) router probabilities (float32)
    expert: torch.Tensor      # (n, k) the chosen experts, best first
    gates: torch.Tensor       # (n, k) their weights
    onehot: torch.Tensor      # (n, k, E)
    counts: torch.Tensor      # (k, E) tokens whose j-th choice is e
    counts_all: list | None = None   # every rank's table (p, k, E), when known before the step


def top_k_route(logits: torch.Tensor, k: int) -> Routing:
    """The learned routing: softmax, the top ``k`` experts of each token, their gates."""
    probs = torch.softmax(logits.float(), dim=-1)
    top_p, top_e = probs.topk(k, dim=-1)
    return _routing(probs, top_e, top_p)


class FixedRouting:
    """Every token's experts decided before the step; the router still runs and sets the gates.

    ``choices[r]`` is rank r's ``(n, k)`` array of experts (:func:`draw_choices`), so
    every rank knows every rank's count table (:attr:`counts_all`) without an exchange.
    Call it in place of :func:`top_k_route`: ``routing = fixed(logits, k)`` on rank ``rank``.
    """

    def __init__(self, choices: list[np.ndarray], rank: int, num_experts: int):
        self.mine = np.asarray(choices[rank], dtype=np.int64)
        self.counts_all = [count_table(c, num_experts) for c in choices]

    def __call__(self, logits: torch.Tensor, k: int) -> Routing:
        if self.mine.shape != (logits.shape[0], k):
            raise ValueError(f"this fixed routing has {self.mine.shape[0]} tokens with "
                             f"{self.mine.shape[1]} choices each, not {logits.shape[0]} and {k}")
        probs = torch.softmax(logits.float(), dim=-1)
        expert = torch.as_tensor(self.mine, device=logits.device)
        return _routing(probs, expert, probs.gather(-1, expert), self.counts_all)


def draw_choices(tokens: int, num_experts: int, k: int, seed: int | None = None,
                 skew: float = 0.0) -> np.ndarray:
    """``(tokens, k)`` distinct experts per token, decided before the step.

    ``seed=None``: balanced, token t's j-th choice is expert ``(t + j) mod E`` (every
    expert gets ``T k / E`` slots when ``E`` divides ``T``). Otherwise drawn without
    replacement with popularity ``(e + 1) ** -skew`` (0: uniform), by the Gumbel top-k
    trick (Kool, van Hoof & Welling 2019).
    """
    check_moe(num_experts, k)
    if seed is None:
        return (np.arange(tokens)[:, None] + np.arange(k)[None, :]) % num_experts
    rng = np.random.default_rng(seed)
    log_popularity = -skew * np.log(np.arange(1, num_experts + 1))
    keys = log_popularity + rng.gumbel(size=(tokens, num_experts))
    return np.argsort(-keys, axis=1, kind="stable")[:, :k]


def count_table(choices: np.ndarray, num_experts: int) -> list[list[int]]:
    """``(k, E)`` integers: how many tokens have expert e as their j-th choice."""
    return [np.bincount(column, minlength=num_experts).tolist() for column in choices.T]


def _routing(probs, expert, chosen_probs, counts_all=None) -> Routing:
    k = expert.shape[1]
    gates = chosen_probs if k == 1 else chosen_probs / chosen_probs.sum(-1, keepdim=True)
    # a comparison, not F.one_hot: on a CPU that checks every value (reads min and max),
    # which a dry run cannot do and a GPU does not do
    onehot = (expert.unsqueeze(-1) == torch.arange(probs.shape[-1], device=expert.device)).long()
    return Routing(probs, expert, gates, onehot, onehot.sum(0), counts_all)


# ----------------------------------------------------------------------------
# Capacity: each expert's C slots, filled in one global order
# ----------------------------------------------------------------------------

@dataclass
class Admission:
    """Which slots fit: ``keep`` (n, k) on this rank; the tables (p, k, E) of every rank."""
    rank: int
    tokens: int                  # global T
    capacity: int | None
    counts_all: list             # slots routed, before dropping
    kept_all: list               # slots kept
    keep: torch.Tensor           # (n, k) bool


def admit(routing: Routing, counts_all: list, rank: int,
          capacity_factor: float | None) -> Admission:
    """This rank's slots that fit in their expert's capacity, in the global order."""
    num_experts, k = len(counts_all[0][0]), len(counts_all[0])
    tokens = sum(sum(table[0]) for table in counts_all)     # each token has one first choice
    capacity = expert_capacity(tokens, num_experts, k, capacity_factor)
    start, kept_all = fill_slots(counts_all, capacity)
    expert = routing.expert
    if capacity is None:
        keep = torch.ones(expert.shape, dtype=torch.bool, device=expert.device)
    else:
        onehot = routing.onehot
        earlier_here = (onehot.cumsum(0) * onehot).sum(-1) - 1          # (n, k)
        before = torch.tensor(start[rank], device=expert.device)        # (k, E)
        keep = before.gather(1, expert.T).T + earlier_here < capacity
    return Admission(rank, tokens, capacity, counts_all, kept_all, keep)


def fill_slots(counts_all: list, capacity: int | None) -> tuple[list, list]:
    """Walk each expert's queue: first choices before second choices, then by rank.

    Returns ``start[r][j][e]``, the slots of ``e`` taken before rank r's j-th
    choices, and ``kept[r][j][e]``, how many of those fit (all of them without a capacity).
    """
    p, k, num_experts = len(counts_all), len(counts_all[0]), len(counts_all[0][0])
    start = [[[0] * num_experts for _ in range(k)] for _ in range(p)]
    kept = [[list(row) for row in table] for table in counts_all]
    for e in range(num_experts):
        taken = 0
        for j in range(k):
            for r in range(p):
                start[r][j][e] = taken
                if capacity is not None:
                    kept[r][j][e] = max(0, min(counts_all[r][j][e], capacity - taken))
                taken += counts_all[r][j][e]
    return start, kept


def expert_capacity(tokens: int, num_experts: int, k: int = 1,
                    capacity_factor: float | None = 1.25) -> int | None:
    """Token slots per expert: ``ceil(capacity_factor * k * tokens / num_experts)``."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * k * tokens / num_experts)


def load_balancing_loss(probs: torch.Tensor, counts_all: list,
                        global_prob_sum: torch.Tensor, tokens: int) -> torch.Tensor:
    """Switch's ``E sum_e f_e P_e``: the global value, the gradient through this rank's tokens."""
    num_experts, k = probs.shape[-1], len(counts_all[0])
    routed = [sum(table[j][e] for table in counts_all for j in range(k))
              for e in range(num_experts)]
    f = torch.tensor(routed, dtype=probs.dtype, device=probs.device) / (k * tokens)
    local_sum = probs.sum(0)
    # the global sum in value, this rank's own probabilities in the gradient
    P = (local_sum + (global_prob_sum.to(probs.dtype) - local_sum.detach())) / tokens
    return num_experts * (f * P).sum()


# ----------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------

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
