# shortcut: buckets built but unused; finish_gradient_synchronization all-reduces each parameter's gradient, blocking, after backward (nothing overlapped, nothing bucketed)
# graded as: ex02_bucketed_ddp.py
# scores: at most 5
# message: after backward
import torch
import torch.distributed as dist
import torch.nn as nn


class BucketedDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float):
        super().__init__()
        self.module = module
        if not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be > 0, not {bucket_size_mb}")
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, 0)
        limit, self.buckets, used = bucket_size_mb * 2**20, [[]], 0
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            size = p.numel() * p.element_size()
            if self.buckets[-1] and used + size > limit:
                self.buckets.append([])
                used = 0
            self.buckets[-1].append(p)
            used += size

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        world = dist.get_world_size()
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
