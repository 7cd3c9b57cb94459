# shortcut: buckets built but unused: each gradient's own async all-reduce launched from its hook (overlapped, but one all-reduce per parameter)
# graded as: ex02_bucketed_ddp.py
# scores: at most 5
# message: one per bucket
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
        param.grad /= self.world_size
        self.pending.append((param, dist.all_reduce(param.grad, async_op=True)))

    def finish_gradient_synchronization(self) -> None:
        for _, work in self.pending:
            work.wait()
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
