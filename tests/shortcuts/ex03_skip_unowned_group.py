# shortcut: (correct) a group of which this rank owns no parameter is not given to the wrapped optimizer, which is made only once the rank owns one
# graded as: ex03_zero1_optimizer.py
# scores: full
import torch
import torch.distributed as dist


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner = {}            # parameter -> rank that steps it
        self.inner = None
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            self.owner[p] = len(self.owner) % self.world_size
            if self.owner[p] == self.rank:
                mine.append(p)
        if not mine:                    # nothing of this group is mine: the wrapped optimizer
            return                      # never hears of it
        inner_group = {k: v for k, v in group.items() if k != "params"}
        inner_group["params"] = mine
        if self.inner is None:
            self.inner = self.optimizer_cls([inner_group], **self.kwargs)
            self.state = self.inner.state
        else:
            self.inner.add_param_group(inner_group)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.inner is not None:      # None while this rank owns no parameter at all
            self.inner.step(**kwargs)
        for p, owner in self.owner.items():
            dist.broadcast(p.data, src=owner)
        return loss
