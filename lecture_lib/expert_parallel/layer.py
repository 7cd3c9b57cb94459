"""The MoE layer, its experts spread over the ranks, and the small GPT built from it.

:class:`MoELayer` runs five named steps, each a method: **route** (top-k of
the router's softmax, :mod:`.router`), **plan** (exchange the count tables,
fill the capacity in global order, the aux loss, the split sizes,
:mod:`.dispatch`), **dispatch** (all-to-all to the experts' ranks),
**experts** (each local expert on its rows) and **combine** (all-to-all
back, weight by the gates, sum per token).

Equal to one process: the same layer with every expert local
(``group=LOCAL``, or one rank) is the reference. On ``p`` ranks, each rank
holding ``1/p`` of the tokens, the outputs, the aux loss, the dropped tokens,
the input and expert gradients, and the router gradient summed over ranks
equal the reference's (tests: rtol 1e-5).

Losses on ranks: :class:`MoEGPT` returns this rank's *share* of the global
objective, ``lm_loss / p + aux_weight * aux``, where ``aux`` carries the
global value but the gradient of this rank's tokens only; summing the
gradients of replicated parameters over the ranks
(:func:`sum_replicated_grads`) then gives the gradient of the one-process
loss exactly, and expert gradients need no reduction at all (the combine
all-to-all's backward already brings every token's gradient to its expert).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..comm import LOCAL
from ..models import GPT, MLP, GPTConfig, init_weights, lm_loss
from ..runtime import device
from .dispatch import DispatchPlan, all_to_all, exchange_counts, plan_dispatch
from .router import (
    Admission,
    MoEConfig,
    Routing,
    admit,
    check_moe,
    load_balancing_loss,
    top_k_route,
)


class MoELayer(nn.Module):
    """Router + ``num_experts`` MLPs spread over the ranks of ``group``.

    ``MoELayer(d_model, d_ff, num_experts, k, capacity_factor, group, seed)``;
    ``forward(x)`` takes ``(..., d_model)`` and returns the same shape. After a
    forward, ``layer.aux_loss`` is the load-balancing loss (global value,
    gradient through this rank's tokens) and ``layer.stats`` the routing
    (global tokens per expert, kept slots, capacity, bytes sent...), built
    when read. Weights come from ``seed`` through :func:`models.init_weights`
    on the full set of experts, then each rank keeps its own, so every world
    size starts from the same weights. Experts are kept in
    ``self.experts[str(e)]`` under their *global* index, so parameter names
    match the one-process layer. Set ``layer.timer = metrics.Timer(...)`` to
    time the phases of forward: "route", "counts" (all-gather of counts),
    "dispatch" (all-to-all), "experts", "combine" (all-to-all back).
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
        self.timer = None                         # a metrics.Timer: off unless a caller sets it
        self.aux_loss: torch.Tensor | None = None
        self._last: tuple | None = None           # what the stats are built from
        self._stats: dict | None = None
        if seed is not None:
            init_weights(self, seed)
        self.place_experts(group)

    def place_experts(self, group) -> None:
        """Keep only this rank's experts: rank r of p holds ``[r E/p, (r+1) E/p)``."""
        self.group, self.ep_rank, self.ep_size = comm.resolve(group)
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
        return comm.maybe(self.timer(name) if self.timer is not None else None)

    # -- the five steps ----------------------------------------------------------------

    def route(self, x: torch.Tensor) -> Routing:
        """Top-k of the router's softmax, the gates, this rank's (k, E) count table."""
        with self._phase("route"):
            return top_k_route(self.router(x), self.k)

    def plan(self, routing: Routing) -> tuple[Admission, DispatchPlan]:
        """Exchange counts, fill the capacity, set ``aux_loss``, lay out the send buffer."""
        with self._phase("counts"):
            counts_all, prob_sum = exchange_counts(routing, self.group)
        with self._phase("route"):
            admitted = admit(routing, counts_all, self.ep_rank, self.capacity_factor)
            self.aux_loss = load_balancing_loss(routing.probs, counts_all, prob_sum,
                                                admitted.tokens)
            return admitted, plan_dispatch(routing, admitted, self.expert_ids)

    def dispatch(self, x: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
        """Each kept slot's token to the rank of its expert."""
        with self._phase("route"):
            send = x[plan.token_of]
        with self._phase("dispatch"):
            return all_to_all(send, plan.send_splits, plan.recv_splits, self.group, "dispatch")

    def run_experts(self, received: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
        """Rows arrive by source rank, then by expert: group them by expert, run, restore."""
        with self._phase("experts"):
            local = torch.arange(self.local_experts, device=received.device).repeat(self.ep_size)
            row_expert = local.repeat_interleave(plan.recv_per.flatten().to(received.device))
            by_expert = row_expert.argsort(stable=True)
            chunks = received[by_expert].split(plan.recv_per.sum(0).tolist())
            done = torch.cat([self.experts[str(e)](c) for e, c in zip(self.expert_ids, chunks)])
            return done[by_expert.argsort()]

    def combine(self, processed, routing: Routing, plan: DispatchPlan, x) -> torch.Tensor:
        """The results home, weighted by their gates, summed per token (dropped: zero)."""
        with self._phase("combine"):
            back = all_to_all(processed, plan.recv_splits, plan.send_splits, self.group,
                              "combine")
        with self._phase("route"):
            weight = routing.gates.T.reshape(-1)[plan.order].unsqueeze(1).to(x.dtype)
            return torch.zeros_like(x).index_add(0, plan.token_of, back * weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        routing = self.route(x)
        admitted, plan = self.plan(routing)
        processed = self.run_experts(self.dispatch(x, plan), plan)
        y = self.combine(processed, routing, plan, x)
        self._last = (routing.expert, routing.gates.detach(), admitted, plan, x.element_size())
        self._stats = None
        return y.reshape(shape)

    # -- what the notebook reads --------------------------------------------------------

    @property
    def stats(self) -> dict:
        """The last forward's routing (copied to the CPU on first read; ``{}`` before any)."""
        if self._stats is None and self._last is not None:
            expert, gates, a, plan, itemsize = self._last
            element = itemsize * self.d_model
            send = plan.send_splits
            self._stats = {
                "tokens": a.tokens, "capacity": a.capacity,
                "tokens_per_expert": a.counts_all.sum((0, 1)).cpu(),    # before dropping
                "kept_per_expert": a.kept_all.sum((0, 1)).cpu(),
                "dropped_fraction": (1.0 - float(a.kept_all.sum()) / (self.k * a.tokens)
                                     if a.tokens else 0.0),
                "expert_index": expert.cpu(), "gates": gates.cpu(), "kept": a.keep.cpu(),
                "send_splits": send, "recv_splits": plan.recv_splits,
                "sent_bytes": (sum(send) - send[self.ep_rank]) * element,
                "buffer_bytes": sum(send) * element,
            }
        return self._stats if self._stats is not None else {}


class MoEGPT(GPT):
    """:class:`models.GPT` whose every block's MLP is an :class:`MoELayer`.

    ``model(idx)`` gives logits; ``model(idx, targets)`` gives this rank's
    share of the objective, ``lm_loss / p + aux_weight * sum of aux losses``
    (the plain loss on one process), and keeps ``model.last_lm`` and
    ``model.last_aux`` (detached). All weights come from ``seed``.
    """

    def __init__(self, cfg: GPTConfig | None = None, moe: MoEConfig | None = None,
                 seed: int = 0, group=None):
        cfg = cfg if cfg is not None else GPTConfig()
        moe = moe if moe is not None else MoEConfig()
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
    comm.all_reduce_flat([p.grad for p in params], group)
