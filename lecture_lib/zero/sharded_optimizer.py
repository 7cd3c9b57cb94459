"""ZeRO stages 1 and 2: shard the optimizer state, then the gradients.

Rajbhandari, Rasley, Ruwase & He 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", sections 5.1, 5.2 and 7. Data parallelism keeps Adam's two
moments for every parameter on every rank; ZeRO-1 keeps, on rank r, only those of the r-th
1/N of each parameter (:mod:`.shards`), and steps only that shard::

    one step of ZeRO-1 on N = 2 ranks         rank 0            rank 1
    backward: full gradients                  g = [g0 g1]       g = [g0 g1]
    reduce-scatter (Psi): chunk r of the sum  g0 summed         g1 summed
    Adam on the shard, its state only         p0 <- p0 - ...    p1 <- p1 - ...
    all-gather (Psi): every updated chunk     p = [p0 p1]       p = [p0 p1]

A reduce-scatter followed by an all-gather is how a ring all-reduce works, so a step sends
2 Psi, as plain data parallelism does. ZeRO-2 (:class:`ShardedGradientOptimizer`) also
frees the gradients early: each is reduce-scattered in backward as soon as it is ready,
and a rank keeps only its chunk. Adam works element by element, so stepping the shards is
*exactly* the unsharded step on the same gradients.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..comm import all_gather_into, group_info, reduce_scatter_into
from .shards import check_enough_elements, pack, padded_flat, shard_bounds, unpack

GRADIENT_MODES = ("synced", "local")


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: optimizer state only for this rank's shard of every parameter.

    ``ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)``, the interface of
    Stanford CS336 assignment 2. ``param_groups`` list every parameter (so ``zero_grad``
    reaches them all); ``inner``, the wrapped optimizer, sees only this rank's shards, views
    into the parameters' own storage, so stepping them updates the parameters in place;
    ``step`` then all-gathers, and every rank holds the full updated parameters.

    ``gradients`` says what the gradients are when ``step`` is called: ``"synced"``
    (default, as in CS336: already averaged over the ranks by the caller, e.g. DDP) or
    ``"local"`` (each rank's own: ``step`` reduce-scatters them, one collective for all).
    """

    def __init__(self, params, optimizer_cls, group=None, gradients: str = "synced", **kwargs):
        if not (isinstance(optimizer_cls, type)
                and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError("optimizer_cls must be a torch.optim.Optimizer class, "
                            f"not {optimizer_cls!r}")
        if gradients not in GRADIENT_MODES:
            raise ValueError(f"gradients must be one of {GRADIENT_MODES}, not {gradients!r} "
                             "(ZeRO-2, reduce-scattered in backward: ShardedGradientOptimizer)")
        self.group, self.gradients = group, gradients
        self.rank, self.world_size = group_info(group, required=True)
        self.shards: dict[nn.Parameter, nn.Parameter] = {}     # parameter -> this rank's shard
        self.inner = None
        super().__init__(params, kwargs)            # torch checks the groups, fills defaults
        self.inner = optimizer_cls([self._shard_group(g) for g in self.param_groups], **kwargs)
        self.state = self.inner.state               # what this rank really keeps
        check_enough_elements(self.shards, self.world_size)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._shard_gradients()
        self.inner.step(**kwargs)
        for shard in self.shards.values():          # ZeRO-1 keeps the full gradients
            shard.grad = None
        self._all_gather_params()
        return loss

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        if self.inner is not None:      # a group added later (the first ones: in __init__)
            self.inner.add_param_group(self._shard_group(self.param_groups[-1]))

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.inner.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        """This rank's shard of the optimizer state (the wrapped optimizer's state dict)."""
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.inner.load_state_dict(state_dict)

    # -- helpers ------------------------------------------------------------------

    def _bounds(self, p: nn.Parameter) -> tuple[int, int, int]:
        return shard_bounds(p.numel(), self.rank, self.world_size)

    def _shard_group(self, group: dict) -> dict:
        """The inner optimizer's group: the same settings, this rank's shards."""
        for p in group["params"]:
            self.shards[p] = self._make_shard(p)
        return {**group, "params": [self.shards[p] for p in group["params"]]}

    def _make_shard(self, p: nn.Parameter) -> nn.Parameter:
        if not p.is_contiguous():
            raise ValueError("ShardedOptimizer needs contiguous parameters")
        _, lo, hi = self._bounds(p)
        return nn.Parameter(p.detach().view(-1)[lo:hi], requires_grad=p.requires_grad)

    def _shard_gradients(self) -> None:
        """Each shard's gradient: this rank's slice of the averaged gradient."""
        params = [p for p in self.shards if p.grad is not None]
        if not params:
            return
        if self.gradients == "local":               # one reduce-scatter sums and cuts them all
            chunks = [self._bounds(p)[0] for p in params]
            mine = _reduce_scatter_mean([p.grad for p in params], self.group,
                                        self.world_size).split(chunks)
        else:                                       # synced: slice the averaged gradient
            mine = [p.grad.reshape(-1)[self._bounds(p)[1]:] for p in params]
        for p, g in zip(params, mine):
            _, lo, hi = self._bounds(p)
            self.shards[p].grad = g[:hi - lo]       # a view: no copy

    def _all_gather_params(self) -> None:
        """One all-gather of every shard: afterwards each rank holds all updated parameters."""
        params = list(self.shards)
        if not params:
            return
        pieces = []
        for p in params:                            # this rank's chunk of each, padded
            chunk, lo, hi = self._bounds(p)
            shard = self.shards[p].detach()
            pieces.append(shard if hi - lo == chunk else F.pad(shard, (0, chunk - (hi - lo))))
        mine, n = torch.cat(pieces), self.world_size
        everyone = torch.empty(mine.numel() * n, dtype=mine.dtype, device=mine.device)
        all_gather_into(everyone, mine, self.group, phase="params")
        # unpack straight into each parameter; one that N does not divide via a padded copy
        outs = [p.view(-1) if p.numel() % n == 0 else p.new_empty(self._bounds(p)[0] * n)
                for p in params]
        unpack(everyone, outs, n)
        for p, out in zip(params, outs):
            if p.numel() % n:
                p.view(-1).copy_(out[:p.numel()])


class ShardedGradientOptimizer(ShardedOptimizer):
    """ZeRO-2: :class:`ShardedOptimizer`, and each gradient reduce-scattered in backward.

    As each parameter's gradient is ready in backward, a hook sums it over the ranks with a
    reduce-scatter, keeps this rank's chunk as the shard's ``.grad`` (kept until
    ``zero_grad``) and frees the full gradient: a rank holds gradients for its shard only.
    """

    def __init__(self, params, optimizer_cls, group=None, **kwargs):
        self._hooks = []
        super().__init__(params, optimizer_cls, group, gradients="local", **kwargs)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.inner.step(**kwargs)                # the shards' gradients came in backward
        self._all_gather_params()
        return loss

    def _make_shard(self, p: nn.Parameter) -> nn.Parameter:
        if p.requires_grad:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._reduce_scatter_grad))
        return super()._make_shard(p)

    def _reduce_scatter_grad(self, p: nn.Parameter) -> None:
        """In backward: sum p.grad over ranks, keep this rank's chunk, free the full gradient."""
        _, lo, hi = self._bounds(p)
        g = _reduce_scatter_mean([p.grad], self.group, self.world_size)[:hi - lo]
        shard = self.shards[p]
        shard.grad = g if shard.grad is None else shard.grad.add_(g)
        p.grad = None


def _reduce_scatter_mean(grads, group, world_size: int) -> torch.Tensor:
    """This rank's chunk of every gradient, summed over the ranks and divided by their number,
    the chunks side by side (:func:`.shards.pack`)."""
    sent = pack(grads, world_size) if len(grads) > 1 else padded_flat(grads[0], world_size)
    out = torch.empty(sent.numel() // world_size, dtype=sent.dtype, device=sent.device)
    reduce_scatter_into(out, sent, group, phase="grads")
    return out.div_(world_size)
