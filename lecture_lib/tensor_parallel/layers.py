"""Tensor-parallel layers: one layer's matrices split across ranks (Megatron-LM).

A linear layer computes ``Y = X W``. Split ``W`` by **columns**,
``W = [W_1 | W_2]``, and each rank computes its own columns of ``Y``:
``Y_i = X W_i`` (the results are *concatenated*). Split ``W`` by **rows**
(and ``X`` by columns to match) and each rank computes a partial product,
``Y = X_1 W_1 + X_2 W_2`` (the results are *summed*). Megatron-LM
(Shoeybi et al. 2019, arXiv:1909.08053) chains the two: a column-parallel
layer, an element-wise activation on the split columns, then a row-parallel
layer, so an MLP costs one all-reduce forward (g) and one backward (f).
Attention is split by heads the same way (q, k, v by columns, the output
projection by rows) and the embedding over the vocabulary.

Every layer takes ``group=`` (default: the world), so the hybrid lecture can
use it on the tp axis of a :class:`~lecture_lib.mesh.RankGrid`. Weights come
from one full layer built from a seed and then split (as picotron does), so a
parallel layer equals its one-device original. ``sequence_parallel=True``
(Korthikanti et al. 2022, arXiv:2205.05198) swaps f and g for the
all-gather / reduce-scatter pair of :mod:`.comm`.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import comm, models
from ..runtime import device as rank_device
from .comm import (
    all_gather_from_sequence_parallel,
    copy_to_tensor_parallel,
    gather_from_tensor_parallel,
    reduce_from_tensor_parallel,
    reduce_scatter_to_sequence_parallel,
    split_to_tensor_parallel,
)


def check_divisible(layer: str, what: str, n: int, tp: int) -> None:
    if n % tp:
        raise ValueError(f"{layer}: {what}={n} is not divisible by tensor-parallel size {tp}")


def seeded_linear(in_features: int, out_features: int, bias: bool = True, seed: int = 0):
    """A full ``nn.Linear`` whose weights depend on the seed only (the layer every rank splits)."""
    g = torch.Generator().manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) / math.sqrt(in_features))
        if bias:
            layer.bias.copy_(torch.randn(out_features, generator=g) * 0.1)
    return layer


def tp_param(t: torch.Tensor, tp_dim: int | None) -> nn.Parameter:
    """A parameter on this rank's device; ``tp_dim`` says along which dim it is split."""
    p = nn.Parameter(t.detach().clone().contiguous().to(rank_device()))
    p.tp_dim = tp_dim
    return p


def shard_slice(n: int, rank: int, tp: int) -> slice:
    """Rank ``rank``'s contiguous ``n / tp`` of ``n`` features (every split layer's rule)."""
    return slice(rank * n // tp, (rank + 1) * n // tp)


def _my_slice(n: int, group) -> slice:
    rank, tp = comm.group_info(group)
    return shard_slice(n, rank, tp)


def weight_shard_shape(in_features: int, out_features: int, tp: int, split: str,
                       rank: int = 0) -> tuple[int, int]:
    """The shape ``[in, out]`` of the ``W_i`` (``Y = X W``, i.e. ``weight.T``) a rank holds.

    ``split="column"``: :class:`ColumnParallelLinear`'s ``out / tp`` output columns;
    ``split="row"``: :class:`RowParallelLinear`'s ``in / tp`` input rows. No process needed.
    """
    if split not in ("column", "row"):
        raise ValueError(f"split must be 'column' or 'row', not {split!r}")
    n = out_features if split == "column" else in_features
    check_divisible(f"{split}-parallel linear", "out_features" if split == "column"
                    else "in_features", n, tp)
    part = len(range(n)[shard_slice(n, rank, tp)])
    return (in_features, part) if split == "column" else (part, out_features)


class ColumnParallelLinear(nn.Module):
    """``Y_i = X W_i``: this rank holds ``out_features / tp`` output columns.

    The input passes through f (or, under sequence parallelism, an all-gather
    of the sequence); ``gather_output=True`` concatenates the columns at the end.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gather_output: bool = False, group=None, seed: int = 0,
                 sequence_parallel: bool = False, _full: nn.Linear | None = None):
        super().__init__()
        check_divisible("ColumnParallelLinear", "out_features", out_features,
                        comm.group_info(group)[1])
        full = _full if _full is not None else seeded_linear(in_features, out_features, bias, seed)
        self.group, self.gather_output = group, gather_output
        self.sequence_parallel = sequence_parallel
        self.in_features, self.out_features = in_features, out_features
        rows = _my_slice(out_features, group)
        self.weight = tp_param(full.weight[rows], 0)
        self.bias = tp_param(full.bias[rows], 0) if full.bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, gather_output: bool = False,
                    sequence_parallel: bool = False):
        """This rank's columns of an existing full layer."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None,
                   gather_output, group, sequence_parallel=sequence_parallel, _full=linear)

    def enter(self, x):
        """What the input needs before the split matmul: f, or the sequence all-gather."""
        if self.sequence_parallel:
            return all_gather_from_sequence_parallel(x, self.group)
        return copy_to_tensor_parallel(x, self.group)

    def project(self, x):
        """The local matmul alone (on an input that has already entered)."""
        return F.linear(x, self.weight, self.bias)

    def forward(self, x):
        y = self.project(self.enter(x))
        return gather_from_tensor_parallel(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """``Y = sum_i X_i W_i``: this rank holds ``in_features / tp`` input rows.

    The input is already split (``input_is_parallel=True``, the output of a
    column-parallel layer) or is split here. The partial products are summed
    by g (or reduce-scattered along the sequence); the bias is added once, after.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 input_is_parallel: bool = True, group=None, seed: int = 0,
                 sequence_parallel: bool = False, _full: nn.Linear | None = None):
        super().__init__()
        check_divisible("RowParallelLinear", "in_features", in_features,
                        comm.group_info(group)[1])
        full = _full if _full is not None else seeded_linear(in_features, out_features, bias, seed)
        self.group, self.input_is_parallel = group, input_is_parallel
        self.sequence_parallel = sequence_parallel
        self.in_features, self.out_features = in_features, out_features
        self.weight = tp_param(full.weight[:, _my_slice(in_features, group)], 1)
        self.bias = tp_param(full.bias, None) if full.bias is not None else None
        if self.bias is not None and sequence_parallel:
            self.bias.sequence_parallel_partial = True

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, input_is_parallel: bool = True,
                    sequence_parallel: bool = False):
        """This rank's rows (input features) of an existing full layer."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None,
                   input_is_parallel, group, sequence_parallel=sequence_parallel, _full=linear)

    def forward(self, x):
        if not self.input_is_parallel:
            x = split_to_tensor_parallel(x, self.group)
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel(y, self.group)
        else:
            y = reduce_from_tensor_parallel(y, self.group)
        return y + self.bias if self.bias is not None else y


class ParallelMLP(nn.Module):
    """Column, GELU, row: one all-reduce forward (g) and one backward (f)."""

    def __init__(self, mlp: models.MLP, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.fc1 = ColumnParallelLinear.from_linear(mlp.fc1, group,
                                                    sequence_parallel=sequence_parallel)
        self.fc2 = RowParallelLinear.from_linear(mlp.fc2, group,
                                                 sequence_parallel=sequence_parallel)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelSelfAttention(nn.Module):
    """Causal attention with ``n_heads / tp`` heads per rank: q, k, v by columns, proj by rows."""

    def __init__(self, attn: models.CausalSelfAttention, group=None,
                 sequence_parallel: bool = False):
        super().__init__()
        check_divisible("ParallelSelfAttention", "n_heads", attn.n_heads,
                        comm.group_info(group)[1])
        self.head_dim = attn.head_dim
        self.q, self.k, self.v = (ColumnParallelLinear.from_linear(
            lin, group, sequence_parallel=sequence_parallel) for lin in (attn.q, attn.k, attn.v))
        self.proj = RowParallelLinear.from_linear(attn.proj, group,
                                                  sequence_parallel=sequence_parallel)

    def forward(self, x):
        x = self.q.enter(x)                       # one f (or all-gather) for q, k and v
        b, t, _ = x.shape
        q, k, v = (lin.project(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, end)`` of the embedding table on each rank; partial lookups summed by g
    (or reduce-scattered along the sequence under sequence parallelism)."""

    def __init__(self, embedding: nn.Embedding, group=None, sequence_parallel: bool = False):
        super().__init__()
        vocab = embedding.num_embeddings
        check_divisible("VocabParallelEmbedding", "vocab_size", vocab, comm.group_info(group)[1])
        self.group, self.sequence_parallel = group, sequence_parallel
        rows = _my_slice(vocab, group)
        self.start, self.end = rows.start, rows.stop
        self.weight = tp_param(embedding.weight[rows], 0)

    def forward(self, idx):
        outside = (idx < self.start) | (idx >= self.end)
        local = (idx - self.start).masked_fill(outside, 0)
        y = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel(y, self.group)
        return reduce_from_tensor_parallel(y, self.group)
