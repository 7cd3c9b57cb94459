# Generated from solutions/ex02_bucketed_ddp.py by `python -m lecture_lib.grading stubs`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grading grade exercises/ex02_bucketed_ddp.py
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
        raise NotImplementedError("ex02: your code here")

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_grad(self, param: torch.Tensor) -> None:
        raise NotImplementedError("ex02: your code here")

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError("ex02: your code here")
