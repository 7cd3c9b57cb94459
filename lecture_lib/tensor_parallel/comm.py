"""Tensor parallelism's communication: Megatron's conjugate operators.

A column-parallel layer followed by a row-parallel one communicates only at
its two edges (Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, section
3 and Fig. 3), through two operators that are each other's transpose:

                 forward                  backward
    f  (copy)    x -> x                   dL/dx = sum over ranks of dL/dx_i  (all-reduce)
    g  (reduce)  y = sum over ranks of y_i (all-reduce)        dL/dy_i = dL/dy

(:class:`CopyToTensorParallelRegion`, :class:`ReduceFromTensorParallelRegion`;
the functions the layers call are :func:`copy_to_tensor_parallel` and
:func:`reduce_from_tensor_parallel`, which do nothing on one rank).

Two more move one dimension between split and whole
(:class:`GatherFromTensorParallelRegion`, :class:`ScatterToTensorParallelRegion`),
and sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, section
4.2.2) splits each all-reduce into a reduce-scatter leaving the sequence
split and an all-gather entering the next split layer
(:class:`ReduceScatterToSequenceParallelRegion`, the course's ``RS``, and
:class:`AllGatherFromSequenceParallelRegion`, ``AG``; the paper calls them
g-bar and g). Each operator is an
``autograd.Function`` with its forward and backward side by side.

Every collective runs through :func:`lecture_lib.comm.collective`, so it is
recorded (bytes, seconds) inside :func:`lecture_lib.comm.record_comm` and costs
nothing extra outside one: no clock, no device synchronisation.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import comm

# ----------------------------------------------------------------------------
# Megatron's operators
# ----------------------------------------------------------------------------

class CopyToTensorParallelRegion(torch.autograd.Function):
    """f: identity forward; all-reduce the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group, "backward"), None


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """g: all-reduce (sum the partial products) forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromTensorParallelRegion(torch.autograd.Function):
    """All-gather along ``dim`` forward (join the column splits); keep my slice backward."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return all_gather(x, group, dim, "forward")

    @staticmethod
    def backward(ctx, grad):
        return split(grad, ctx.group, ctx.dim), None, None


class ScatterToTensorParallelRegion(torch.autograd.Function):
    """Keep my slice along ``dim`` forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return split(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.group, ctx.dim, "backward"), None, None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Sequence parallel RS (the paper's g-bar): reduce-scatter along the sequence
    forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return reduce_scatter(x, group, dim, "forward")

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.group, ctx.dim, "backward"), None, None


class AllGatherFromSequenceParallelRegion(torch.autograd.Function):
    """Sequence parallel AG (the paper's g): all-gather the sequence forward;
    reduce-scatter the gradient back."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return all_gather(x, group, dim, "forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, ctx.group, ctx.dim, "backward"), None, None


# ----------------------------------------------------------------------------
# The functional names the layers (and notebook 04) call; one rank: nothing to do
# ----------------------------------------------------------------------------

def _alone(group) -> bool:
    return comm.group_info(group)[1] == 1


def copy_to_tensor_parallel(x, group=None):
    """Megatron's f: identity forward, all-reduce backward."""
    return x if _alone(group) else CopyToTensorParallelRegion.apply(x, group)


def reduce_from_tensor_parallel(x, group=None):
    """Megatron's g: all-reduce forward, identity backward."""
    return x if _alone(group) else ReduceFromTensorParallelRegion.apply(x, group)


def gather_from_tensor_parallel(x, group=None, dim: int = -1):
    """All-gather along ``dim`` forward (concatenate the column splits); split backward."""
    return x if _alone(group) else GatherFromTensorParallelRegion.apply(x, group, dim)


def split_to_tensor_parallel(x, group=None, dim: int = -1):
    """Keep this rank's slice along ``dim`` forward; all-gather backward."""
    return x if _alone(group) else ScatterToTensorParallelRegion.apply(x, group, dim)


def reduce_scatter_to_sequence_parallel(x, group=None, dim: int = 1):
    """Sum the partial results and keep this rank's part of the sequence; all-gather backward."""
    return x if _alone(group) else ReduceScatterToSequenceParallelRegion.apply(x, group, dim)


def all_gather_from_sequence_parallel(x, group=None, dim: int = 1):
    """Gather the whole sequence forward; reduce-scatter the gradient backward."""
    return x if _alone(group) else AllGatherFromSequenceParallelRegion.apply(x, group, dim)


# ----------------------------------------------------------------------------
# The collectives the operators run, each returning a new tensor
# (dim: the one split or joined)
# ----------------------------------------------------------------------------

def all_reduce(x: torch.Tensor, group=None, phase: str = "", op=dist.ReduceOp.SUM):
    """The sum (or ``op``) of ``x`` over the group, in a new tensor."""
    group, _, size = comm.resolve(group)
    if size == 1:
        return x
    out = x.contiguous().clone()
    with comm.collective("all_reduce", out.numel() * out.element_size(), size, phase,
                         out.device):
        dist.all_reduce(out, op=op, group=group)
    return out


def all_gather(x: torch.Tensor, group=None, dim: int = -1, phase: str = ""):
    """Every rank's ``x`` concatenated along ``dim``, in rank order."""
    _, _, size = comm.resolve(group)
    if size == 1:
        return x
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((size * front.shape[0],) + front.shape[1:])
    comm.all_gather_into(out, front, group, phase)
    return out.movedim(0, dim).contiguous()


def reduce_scatter(x: torch.Tensor, group=None, dim: int = -1, phase: str = ""):
    """This rank's chunk along ``dim`` of the sum of ``x`` over the group."""
    _, _, size = comm.resolve(group)
    if size == 1:
        return x
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((front.shape[0] // size,) + front.shape[1:])
    comm.reduce_scatter_into(out, front, group, phase)
    return out.movedim(0, dim).contiguous()


def split(x: torch.Tensor, group=None, dim: int = -1):
    """This rank's chunk of ``x`` along ``dim`` (no communication)."""
    _, rank, size = comm.resolve(group)
    if x.shape[dim] % size:
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} is not divisible by "
                         f"tensor-parallel size {size}")
    return x.chunk(size, dim)[rank].contiguous()
