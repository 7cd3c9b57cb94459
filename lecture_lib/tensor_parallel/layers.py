"""Tensor-parallel layers: one layer's matrices split across ranks (Megatron-LM).

A linear layer computes ``Y = X W``. Split ``W`` by columns and each rank
computes its own columns of ``Y`` (concatenated); split ``W`` by rows (and ``X``
by columns to match) and each rank computes a partial product (summed)::

    column:  X @ [W_1 | W_2] = [X W_1 | X W_2]       row:  [X_1 | X_2] @ [W_1] = X_1 W_1 + X_2 W_2
                                                                         [W_2]

Shoeybi et al. 2019 (arXiv:1909.08053, section 3) chain the two, so a block
talks only at its edges, through f and g (:mod:`.comm`)::

    MLP:        f -> X W1_i (column) -> GELU -> . W2_i (row) -> g   (notebook 04's W1, W2)
    attention:  f -> q, k, v of my heads (column) -> attention -> . proj_i (row) -> g

f is the identity forward and an all-reduce backward; g the other way round.
Each parallel layer is built by splitting one full layer (as picotron does),
so it equals its one-device original; ``group=`` (default: the world) lets the
hybrid lecture use it on the tp axis of a :class:`~lecture_lib.mesh.RankGrid`.
Sequence parallelism (the same layers with f and g swapped for an all-gather
and a reduce-scatter) is in :mod:`.sequence_parallel`.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import comm, models
from ..runtime import device as rank_device
from .comm import (
    copy_to_tensor_parallel,
    gather_from_tensor_parallel,
    reduce_from_tensor_parallel,
    split_to_tensor_parallel,
)


class ColumnParallelLinear(nn.Module):
    """``Y_i = X W_i``: this rank holds ``out_features / tp`` output columns of ``W``.

    The input passes through f; ``gather_output=True`` concatenates every rank's
    columns at the end. ``full`` is the layer to split (default: a
    :func:`seeded_linear` of ``seed``).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gather_output: bool = False, group=None, seed: int = 0,
                 full: nn.Linear | None = None):
        super().__init__()
        check_divisible(type(self).__name__, "out_features", out_features,
                        comm.group_info(group)[1])
        full = full if full is not None else seeded_linear(in_features, out_features, bias, seed)
        self.group, self.gather_output = group, gather_output
        self.in_features, self.out_features = in_features, out_features
        out_cols = my_part(out_features, group)
        # nn.Linear stores W transposed ([out, in]): W's output columns are rows of .weight
        self.weight = tp_param(full.weight[out_cols], 0)
        self.bias = tp_param(full.bias[out_cols], 0) if full.bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, **options):
        """This rank's columns of an existing full layer."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None,
                   group=group, full=linear, **options)

    def forward(self, x):
        x = copy_to_tensor_parallel(x, self.group)          # f
        y = self.my_columns(x)
        return gather_from_tensor_parallel(y, self.group) if self.gather_output else y

    def my_columns(self, x):
        """``X W_i + b_i`` on an input that has already passed f (no communication)."""
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``Y = sum_i X_i W_i``: this rank holds ``in_features / tp`` input rows of ``W``.

    The input is already split (``input_is_parallel=True``: the output of a
    column-parallel layer) or is split here. g sums the partial products; the
    bias, held whole by every rank, is added once, after the sum.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 input_is_parallel: bool = True, group=None, seed: int = 0,
                 full: nn.Linear | None = None):
        super().__init__()
        check_divisible(type(self).__name__, "in_features", in_features,
                        comm.group_info(group)[1])
        full = full if full is not None else seeded_linear(in_features, out_features, bias, seed)
        self.group, self.input_is_parallel = group, input_is_parallel
        self.in_features, self.out_features = in_features, out_features
        in_rows = my_part(in_features, group)
        self.weight = tp_param(full.weight[:, in_rows], 1)      # W's rows: columns of .weight
        self.bias = tp_param(full.bias, None) if full.bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, **options):
        """This rank's rows (input features) of an existing full layer."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None,
                   group=group, full=linear, **options)

    def forward(self, x):
        if not self.input_is_parallel:
            x = split_to_tensor_parallel(x, self.group)      # keep my input columns X_i
        y = reduce_from_tensor_parallel(F.linear(x, self.weight), self.group)   # g
        return y + self.bias if self.bias is not None else y


class ParallelMLP(nn.Module):
    """Column, activation, row: one all-reduce forward (g) and one backward (f).

    GPT's ``fc2(gelu(fc1(x)))``, or Llama's SwiGLU ``fc2(silu(gate(x)) * fc1(x))``
    (``gate`` split by columns like ``fc1``, sharing one f).
    """
    Row = RowParallelLinear            # the second matrix's split (sequence parallelism swaps it)

    def __init__(self, mlp: models.MLP, group=None):
        super().__init__()
        self.group = group
        self.fc1 = ColumnParallelLinear.from_linear(mlp.fc1, group)
        gate = getattr(mlp, "gate", None)
        self.gate = ColumnParallelLinear.from_linear(gate, group) if gate is not None else None
        self.fc2 = self.Row.from_linear(mlp.fc2, group)

    def forward(self, x):
        x = copy_to_tensor_parallel(x, self.group)          # f
        return self.fc2(self.my_hidden(x))                   # g inside the row-parallel fc2

    def my_hidden(self, x):
        """This rank's columns of the hidden layer (no communication)."""
        if self.gate is None:
            return F.gelu(self.fc1.my_columns(x))
        return F.silu(self.gate.my_columns(x)) * self.fc1.my_columns(x)


class ParallelSelfAttention(nn.Module):
    """Causal attention with ``n_heads / tp`` heads per rank: q, k, v by columns, proj by rows.

    With grouped-query attention each rank holds ``n_kv_heads / tp`` key/value
    heads: the ones its query heads share (tp must divide both head counts).
    """
    Row = RowParallelLinear            # the output projection's split

    def __init__(self, attn: models.CausalSelfAttention, group=None):
        super().__init__()
        tp = comm.group_info(group)[1]
        check_divisible(type(self).__name__, "n_heads", attn.n_heads, tp)
        check_divisible(type(self).__name__, "n_kv_heads", attn.k.out_features // attn.head_dim,
                        tp)
        self.group, self.head_dim = group, attn.head_dim
        self.q, self.k, self.v = (ColumnParallelLinear.from_linear(lin, group)
                                  for lin in (attn.q, attn.k, attn.v))
        self.proj = self.Row.from_linear(attn.proj, group)

    def forward(self, x):
        x = copy_to_tensor_parallel(x, self.group)          # f, once for q, k and v
        return self.proj(self.my_heads(x))                   # g inside the row-parallel proj

    def my_heads(self, x):
        """Attention of this rank's heads, ``(b, t, heads / tp * head_dim)`` (no communication)."""
        b, t, _ = x.shape
        q, k, v = (lin.my_columns(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        return models.attention(q, k, v).transpose(1, 2).reshape(b, t, -1)


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, end)`` of the embedding table on each rank; g sums the partial lookups
    (a token outside my rows looks up zeros)."""

    def __init__(self, embedding: nn.Embedding, group=None):
        super().__init__()
        vocab = embedding.num_embeddings
        check_divisible(type(self).__name__, "vocab_size", vocab, comm.group_info(group)[1])
        self.group = group
        rows = my_part(vocab, group)
        self.start, self.end = rows.start, rows.stop
        self.weight = tp_param(embedding.weight[rows], 0)

    def forward(self, idx):
        return reduce_from_tensor_parallel(self.my_lookup(idx), self.group)   # g

    def my_lookup(self, idx):
        """The embeddings of the tokens in my rows, zeros for the others (no communication)."""
        outside = (idx < self.start) | (idx >= self.end)
        local = (idx - self.start).masked_fill(outside, 0)
        return F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)


# ----------------------------------------------------------------------------
# Helpers: the split rule, the parameters, the checks
# ----------------------------------------------------------------------------

def check_divisible(layer: str, what: str, n: int, tp: int) -> None:
    if n % tp:
        raise ValueError(f"{layer}: {what}={n} is not divisible by tensor-parallel size {tp}")


def shard_slice(n: int, rank: int, tp: int) -> slice:
    """Rank ``rank``'s contiguous ``n / tp`` of ``n`` features (every split layer's rule)."""
    return slice(rank * n // tp, (rank + 1) * n // tp)


def my_part(n: int, group) -> slice:
    """This rank's :func:`shard_slice` of ``n`` features in ``group``."""
    rank, tp = comm.group_info(group)
    return shard_slice(n, rank, tp)


def tp_param(t: torch.Tensor, tp_dim: int | None) -> nn.Parameter:
    """A parameter on this rank's device; ``tp_dim`` says along which dim it is split
    (None: replicated). The slice is copied, so the full layer can be freed."""
    p = nn.Parameter(t.detach().clone().contiguous().to(rank_device()))
    p.tp_dim = tp_dim
    return p


def seeded_linear(in_features: int, out_features: int, bias: bool = True, seed: int = 0):
    """A full ``nn.Linear`` whose weights depend on the seed only (the layer every rank splits)."""
    g = torch.Generator().manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) / math.sqrt(in_features))
        if bias:
            layer.bias.copy_(torch.randn(out_features, generator=g) * 0.1)
    return layer


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
