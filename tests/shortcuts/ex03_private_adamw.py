# shortcut: a hand-written AdamW keeps every parameter's moments in a private dict on every rank, ignores optimizer_cls, broadcasts from the owners and shows a filtered opt.state
# graded as: ex03_zero1_optimizer.py
# scores: at most 5
# message: optimizer_cls
import math

import torch
import torch.distributed as dist


class _Owned(dict):
    """What opt.state shows: the private moments of the parameters this rank owns."""


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.owner, self.moments = {}, {}
        defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        defaults.update(kwargs)
        super().__init__(params, defaults)
        self.state = _Owned()

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            self.owner[p] = len(self.owner) % self.world

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                m = self.moments.setdefault(p, {"step": 0, "exp_avg": torch.zeros_like(p),
                                                "exp_avg_sq": torch.zeros_like(p)})
                m["step"] += 1
                p.mul_(1 - lr * wd)
                m["exp_avg"].lerp_(p.grad, 1 - b1)
                m["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                bc1, bc2 = 1 - b1 ** m["step"], 1 - b2 ** m["step"]
                denom = (m["exp_avg_sq"].sqrt() / math.sqrt(bc2)).add_(eps)
                p.addcdiv_(m["exp_avg"], denom, value=-lr / bc1)
                if self.owner[p] == self.rank:
                    self.state[p] = m
        for p, owner in self.owner.items():
            dist.broadcast(p.data, src=owner)
