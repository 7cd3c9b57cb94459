"""Exercise 02: data parallelism with overlapped, bucketed gradient all-reduce.

Write ``BucketedDDP(module, bucket_size_mb)``, the data-parallel wrapper of
Stanford CS336 assignment 2 (and, in spirit, of torch's DistributedDataParallel):

* construction: broadcast rank 0's parameters and buffers to every rank, so all
  replicas start equal; group the parameters that require a gradient into
  buckets, walking them in *reverse* order (backward produces the last layer's
  gradients first) and starting a new bucket when the next parameter would push
  the bucket past ``bucket_size_mb`` MB (``2**20`` bytes; a parameter larger than
  that gets a bucket of its own), and keep them as ``self.buckets``, a list of
  buckets, each a list of parameters (the tests read which parameters each holds);
  register a post-accumulate-grad hook on every such parameter
  (``p.register_post_accumulate_grad_hook``).
* during backward (the hook): count the bucket's ready gradients; when the bucket
  is full, flatten its gradients into one buffer, divide by the world size and
  launch ``dist.all_reduce(buffer, async_op=True)`` at once, so the
  communication overlaps the rest of backward. Launch the buckets in index order
  on every rank (all ranks must issue their collectives in the same order). The
  tests note, at each launch, how many gradients backward has produced: bucket
  i's all-reduce goes as soon as buckets 0 to i are all full, not later.
* ``finish_gradient_synchronization()``: wait for every launched all-reduce and
  copy the averaged values back into each parameter's ``.grad``.
* ``forward`` calls the wrapped module; ``.module`` is the wrapped module.

A bucket size of 0 or below is a ``ValueError`` (before anything else).
Notebook 02 measures what bucket size is best and why.
"""
import torch
import torch.distributed as dist
import torch.nn as nn


class BucketedDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float):
        super().__init__()
        self.module = module
        # BEGIN SOLUTION
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
        # END SOLUTION

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_grad(self, param: torch.Tensor) -> None:
        # BEGIN SOLUTION
        self.ready[self.index[param]] += 1
        while (len(self.pending) < len(self.buckets)
               and self.ready[len(self.pending)] == len(self.buckets[len(self.pending)])):
            i = len(self.pending)
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]]) / self.world_size
            self.pending.append((i, flat, dist.all_reduce(flat, async_op=True)))
        # END SOLUTION

    def finish_gradient_synchronization(self) -> None:
        # BEGIN SOLUTION
        for i, flat, work in self.pending:
            work.wait()
            params = self.buckets[i]
            for p, part in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(part.view_as(p))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
        # END SOLUTION
