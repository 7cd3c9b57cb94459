# shortcut: column layer all-gathers the full weight each forward, slices its output (f kept)
# graded as: ex05_tensor_parallel.py
# scores: at most 6.5
# message: ran a collective in its forward
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
import torch.nn as nn
import torch.nn.functional as F


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    def __init__(self, full):
        super().__init__()
        rank, size = dist.get_rank(), dist.get_world_size()
        if full.out_features % size:
            raise ValueError(f"out_features={full.out_features} is not divisible by {size}")
        self.rank, self.size = rank, size
        self.weight = nn.Parameter(full.weight.detach().chunk(size, 0)[rank].clone())
        self.bias = nn.Parameter(full.bias.detach().chunk(size, 0)[rank].clone())

    def forward(self, x):
        weight = torch.cat(dnn.all_gather(self.weight))          # every rank's rows
        y = F.linear(CopyToTensorParallel.apply(x), weight)
        return y.chunk(self.size, -1)[self.rank] + self.bias


class RowParallelLinear(nn.Module):
    def __init__(self, full):
        super().__init__()
        rank, size = dist.get_rank(), dist.get_world_size()
        if full.in_features % size:
            raise ValueError(f"in_features={full.in_features} is not divisible by {size}")
        self.weight = nn.Parameter(full.weight.detach().chunk(size, 1)[rank].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        return ReduceFromTensorParallel.apply(F.linear(x, self.weight)) + self.bias
