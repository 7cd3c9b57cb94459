# shortcut: right buckets, async all-reduces launched from the hook, but only once the last gradient of backward is in (nothing overlaps backward)
# graded as: ex02_bucketed_ddp.py
# scores: at most 5
# message: overlap
import torch
import torch.distributed as dist
import torch.nn as nn


class BucketedDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float):
        super().__init__()
        self.module = module
        if not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be > 0, not {bucket_size_mb}")
        self.world_size = dist.get_world_size()
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
        self.index = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.pending = []                       # (bucket index, flat buffer, work handle)
        for p in self.index:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_grad(self, param: torch.Tensor) -> None:
        self.ready[self.index[param]] += 1
        if sum(self.ready) < len(self.index):       # wait for the whole backward
            return
        for i in range(len(self.buckets)):
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]]) / self.world_size
            self.pending.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def finish_gradient_synchronization(self) -> None:
        for i, flat, work in self.pending:
            work.wait()
            params = self.buckets[i]
            for p, part in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(part.view_as(p))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
