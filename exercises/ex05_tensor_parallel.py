# Generated from solutions/ex05_tensor_parallel.py by `python -m lecture_lib.grading stubs`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grading grade exercises/ex05_tensor_parallel.py
"""Exercise 05: Megatron's f and g, and the column- and row-parallel linear layers.

A linear layer computes ``y = x W^T + b`` with ``W`` of shape ``(out, in)``.

* ``ColumnParallelLinear`` keeps this rank's ``out / p`` rows of ``W`` (and of
  ``b``): rank ``r`` holds output features ``[r * out/p, (r+1) * out/p)``.
  Its input goes through **f** first: the identity forward, but in the backward
  pass every rank holds only part of the input's gradient, so f all-reduces it.
* ``RowParallelLinear`` keeps this rank's ``in / p`` columns of ``W`` and takes
  an input already split the same way (the output of a column-parallel layer).
  The partial products go through **g**: an all-reduce forward (sum the
  partial results), the identity backward. The bias is added once, after g.

Build each layer from a full ``nn.Linear`` (its shard as new ``nn.Parameter`` tensors on this
rank, ``self.weight`` and ``self.bias``: the tests read their gradients, and check that the layer
keeps nothing more: no copy or view of the full weight, which is what tensor parallelism saves),
and compute from the shard alone: ``ColumnParallelLinear``'s forward runs no collective at all,
``RowParallelLinear``'s one all-reduce (g), and the backwards the reverse (the tests count every
``torch.distributed`` call). Write f and g as
``torch.autograd.Function`` classes, ``forward(ctx, x)`` and ``backward(ctx, grad)``, on the
default process group. f and g must leave alone the tensors autograd hands them (``x`` in
forward, ``grad`` in backward): autograd may still need them. The tests use f and g on their
own too, with a nonlinearity on both sides of g (``tanh(g(tanh(a)))``) and a reduction after f
(``f(b).sum()``, whose gradient autograd hands f as an expanded, read-only view).

Hints (the idea, not the code):

* f and g are each other's transpose: what one does forward, the other does backward. Ask of
  each pass which ranks hold only a *partial* value of something that must be whole: in g's
  forward, every rank has a partial product; in f's backward, every rank has only the part of
  ``dL/dx`` that flowed through its own columns.
* Check a shard by its shape: a column split keeps whole output features (rows of
  ``weight``), a row split whole input features (its columns); notebook 04's picture writes
  the shape of each shard.
* A collective overwrites its tensor in place, and autograd may still need the tensor it
  handed you.

Notebook 04 draws where f and g sit in the Megatron MLP and attention;
``lecture_lib.tensor_parallel``
holds the full version (sequence parallelism, attention, the vocabulary-parallel loss).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("ex05: your code here")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("ex05: your code here")


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("ex05: your code here")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("ex05: your code here")


class ColumnParallelLinear(nn.Module):
    """This rank's output features of ``full``; ``forward(x)`` gives this rank's columns of y."""

    def __init__(self, full: nn.Linear):
        super().__init__()
        rank, size = dist.get_rank(), dist.get_world_size()
        if full.out_features % size:
            raise ValueError(f"out_features={full.out_features} is not divisible by {size} ranks")
        raise NotImplementedError("ex05: your code here")

    def forward(self, x):
        raise NotImplementedError("ex05: your code here")


class RowParallelLinear(nn.Module):
    """This rank's input features of ``full``.

    ``forward(x_i)`` (x split by columns) gives all of y.
    """

    def __init__(self, full: nn.Linear):
        super().__init__()
        rank, size = dist.get_rank(), dist.get_world_size()
        if full.in_features % size:
            raise ValueError(f"in_features={full.in_features} is not divisible by {size} ranks")
        raise NotImplementedError("ex05: your code here")

    def forward(self, x):
        raise NotImplementedError("ex05: your code here")
