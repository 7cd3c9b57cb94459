"""The MoE layer with its experts spread over the ranks, and the small GPT built from it.

:class:`MoELayer`'s forward is the lecture's five steps: **route** (each token picks ``k``
experts), **count** (the ranks exchange their count tables; capacity, the aux loss and the
split sizes follow), **dispatch** (all-to-all to the experts' ranks), **experts** (each
local expert on its rows), **combine** (all-to-all back, weighted by the gates, summed per
token). Rank r of p holds experts ``[r E/p, (r+1) E/p)`` and routes its own tokens.

Equal to one process: with every expert local (``group=LOCAL``) the layer is the
reference, and on ``p`` ranks outputs, aux loss, dropped tokens and gradients equal it
(tests: rtol 1e-5). A watcher (:mod:`lecture_lib.observe`) sees each step as a span
("route", "counts", "dispatch", "experts", "combine") and each forward's routing as a
``"routing"`` note (the routing, its admission, its plan).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm, observe
from ..comm import LOCAL
from ..models import GPT, MLP, GPTConfig, init_weights, lm_loss
from ..runtime import device
from .dispatch import all_to_all, exchange_counts, plan_dispatch
from .router import MoEConfig, admit, check_moe, load_balancing_loss, top_k_route


class MoELayer(nn.Module):
    """Router + ``num_experts`` MLPs (``mlp``: "gelu" or "swiglu") over the ranks of ``group``.

    ``forward(x)`` takes ``(..., d_model)`` and returns the same shape, and sets
    ``aux_loss`` (global value, gradient through this rank's tokens). Weights come
    from ``seed`` on the full set of experts, then each rank keeps its own, so every
    world size starts from the same weights; experts are kept in
    ``self.experts[str(e)]`` under their *global* index, as in the one-process layer.
    ``choose_experts`` is :func:`~.router.top_k_route`, or a
    :class:`~.router.FixedRouting` for a routing decided before the step.
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, k: int = 1,
                 capacity_factor: float | None = 1.25, group=None, seed: int | None = 0,
                 mlp: str = "gelu"):
        super().__init__()
        check_moe(num_experts, k, capacity_factor)
        self.d_model, self.num_experts, self.k = d_model, num_experts, k
        self.capacity_factor = capacity_factor
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.choose_experts = top_k_route
        shape = GPTConfig(vocab_size=1, seq_len=1, d_model=d_model, n_heads=1, n_layers=1,
                          d_ff=d_ff, mlp=mlp)
        self.experts = nn.ModuleDict({str(e): MLP(shape) for e in range(num_experts)})
        self.aux_loss: torch.Tensor | None = None
        if seed is not None:
            init_weights(self, seed)
        self.place_experts(group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, x = x.shape, x.reshape(-1, x.shape[-1])
        with observe.span("route", x.device):
            routing = self.choose_experts(self.router(x), self.k)
        with observe.span("counts", x.device):
            counts_all, prob_sum = exchange_counts(routing, self.group)
            admitted = admit(routing, counts_all, self.ep_rank, self.capacity_factor)
            self.aux_loss = load_balancing_loss(routing.probs, counts_all, prob_sum,
                                                admitted.tokens)
            plan = plan_dispatch(routing, admitted, self.expert_ids)
        with observe.span("dispatch", x.device):
            received = all_to_all(x[plan.token_of], plan.send_splits, plan.recv_splits,
                                  self.group, "dispatch")
        with observe.span("experts", x.device):
            processed = self.run_experts(received, plan.recv_per)
        with observe.span("combine", x.device):
            back = all_to_all(processed, plan.recv_splits, plan.send_splits, self.group,
                              "combine")
            gates = routing.gates.T.reshape(-1)[plan.order].unsqueeze(1).to(x.dtype)
            y = torch.zeros_like(x).index_add(0, plan.token_of, back * gates)   # dropped: 0
        observe.note("routing", routing=routing, admission=admitted, plan=plan,
                     row_bytes=x.shape[-1] * x.element_size())
        return y.reshape(shape)

    def run_experts(self, received: torch.Tensor, recv_per: list[list[int]]) -> torch.Tensor:
        """Rows arrive by source rank, then by expert: regroup them by expert, run each
        expert once on all its rows, and put the results back in arrival order."""
        p, local = len(recv_per), self.local_experts
        chunks = received.split([n for row in recv_per for n in row])   # (rank r, expert i)
        outputs = [self.experts[str(e)](torch.cat(chunks[i::local]))
                   for i, e in enumerate(self.expert_ids)]
        pieces = [out.split([recv_per[r][i] for r in range(p)]) for i, out in enumerate(outputs)]
        return torch.cat([pieces[i][r] for r in range(p) for i in range(local)])

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


class MoEGPT(GPT):
    """:class:`models.GPT` whose every block's MLP is an :class:`MoELayer`.

    ``model(idx)`` gives logits; ``model(idx, targets)`` gives this rank's share of the
    objective, ``lm_loss / p + aux_weight * aux`` (:meth:`objective`; the plain loss on
    one process): ``aux`` carries the global value but the gradient of this rank's tokens,
    so summing the replicated parameters' gradients over the ranks
    (:func:`sum_replicated_grads`) gives the one-process gradient, and expert gradients
    need no reduction (the combine all-to-all's backward brings each token's gradient to
    its expert). All weights come from ``seed``.
    """

    def __init__(self, cfg: GPTConfig | None = None, moe: MoEConfig | None = None,
                 seed: int = 0, group=None):
        cfg = cfg if cfg is not None else GPTConfig()
        moe = moe if moe is not None else MoEConfig()
        super().__init__(cfg, seed)
        self.moe = moe
        for block in self.blocks:
            block.mlp = MoELayer(cfg.d_model, cfg.d_ff, moe.num_experts, moe.k,
                                 moe.capacity_factor, group=LOCAL, seed=None, mlp=cfg.mlp)
        init_weights(self, seed)                # the whole model, every expert, one generator
        for layer in self.moe_layers():
            layer.place_experts(group)
        self.ep_size = self.moe_layers()[0].ep_size
        self.to(self.moe_layers()[0].router.weight.device)

    def forward(self, idx, targets=None):
        logits = super().forward(idx)
        return logits if targets is None else self.objective(lm_loss(logits, targets))

    def objective(self, lm: torch.Tensor) -> torch.Tensor:
        """This rank's share of the global objective: ``lm / p + aux_weight * aux``."""
        return lm / self.ep_size + self.moe.aux_weight * self.summed_aux_loss()

    def summed_aux_loss(self) -> torch.Tensor:
        """The load-balancing losses of the last forward, summed over the MoE layers."""
        return sum(layer.aux_loss for layer in self.moe_layers())

    def moe_layers(self) -> list[MoELayer]:
        return [block.mlp for block in self.blocks]

    def expert_parameters(self) -> list[nn.Parameter]:
        return [p for layer in self.moe_layers() for p in layer.experts.parameters()]

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Every parameter that each rank holds a copy of (gradients summed over ranks)."""
        experts = {id(p) for p in self.expert_parameters()}
        return [p for p in self.parameters() if id(p) not in experts]


def sum_replicated_grads(params, group=None) -> None:
    """All-reduce (sum) the gradients of replicated parameters, in one flat buffer."""
    comm.all_reduce_flat([p.grad for p in params], group)
