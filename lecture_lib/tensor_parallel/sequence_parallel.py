"""Sequence parallelism: tensor parallelism's layers with f and g split in two.

Between two tensor-parallel regions every rank holds the whole sequence, and the
layer norms, dropouts and residuals there repeat the same work on every rank
and keep the same activations. Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", arXiv:2205.05198, section 4.2.2)
split those regions along the sequence instead. The all-reduce of g becomes a
reduce-scatter (sum the partial products, keep my tokens), and f becomes an
all-gather (the whole sequence, for the split matmuls)::

    [s/tp] LayerNorm -> AG -> [s] column .. row -> RS -> [s/tp] residual -> ...

An all-reduce is a reduce-scatter followed by an all-gather, so the bytes sent
are the same; the activations between the regions shrink by ``tp``. The
weights the sequence-split regions hold (layer norms, the position embedding,
the row-parallel biases) see only ``1/tp`` of the tokens, so their gradients
are partial sums: :func:`sync_sequence_parallel_grads` adds them up.

Each class here is its tensor-parallel namesake with only the communication
changed: read it beside :mod:`.layers` and :mod:`.model`.
"""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from .. import comm, models
from .comm import all_gather_from_sequence_parallel, reduce_scatter_to_sequence_parallel
from .layers import (
    ColumnParallelLinear,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from .model import ParallelBlock, TensorParallelGPT, check_tensor_parallel


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """:class:`ColumnParallelLinear` on an input split along the sequence: AG instead of f."""

    def forward(self, x):
        x = all_gather_from_sequence_parallel(x, self.group)     # AG: the whole sequence
        return self.my_columns(x)


class SequenceParallelRowLinear(RowParallelLinear):
    """:class:`RowParallelLinear` whose output stays split along the sequence: RS instead of g."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.input_is_parallel:
            raise ValueError(f"{type(self).__name__} takes an input already split by columns")
        mark_partial(self.bias)

    def forward(self, x):
        y = reduce_scatter_to_sequence_parallel(F.linear(x, self.weight), self.group)   # RS
        return y + self.bias if self.bias is not None else y


class SequenceParallelMLP(ParallelMLP):
    Row = SequenceParallelRowLinear

    def forward(self, x):
        x = all_gather_from_sequence_parallel(x, self.group)     # AG, once for fc1 (and gate)
        return self.fc2(self.my_hidden(x))                        # RS inside fc2


class SequenceParallelSelfAttention(ParallelSelfAttention):
    Row = SequenceParallelRowLinear

    def forward(self, x):
        x = all_gather_from_sequence_parallel(x, self.group)     # AG, once for q, k and v
        return self.proj(self.my_heads(x))                        # RS inside proj


class SequenceParallelVocabEmbedding(VocabParallelEmbedding):
    def forward(self, idx):
        return reduce_scatter_to_sequence_parallel(self.my_lookup(idx), self.group)   # RS


class SequenceParallelBlock(ParallelBlock):
    """A block whose input and output are this rank's ``s / tp`` tokens."""
    Attention, MLP = SequenceParallelSelfAttention, SequenceParallelMLP

    def __init__(self, block: models.Block, group=None):
        super().__init__(block, group)
        mark_partial(*self.ln1.parameters(), *self.ln2.parameters())


class SequenceParallelGPT(TensorParallelGPT):
    """:class:`TensorParallelGPT` with every block sequence-parallel; the embedding
    reduce-scatters into this rank's part of the sequence, the head gathers it back."""
    Embedding, Block, Head = (SequenceParallelVocabEmbedding, SequenceParallelBlock,
                              SequenceParallelColumnLinear)

    def __init__(self, gpt: models.GPT, group=None):
        check_tensor_parallel(gpt.cfg, comm.group_info(group)[1], sequence_parallel=True)
        super().__init__(gpt, group)
        mark_partial(*self.pos_emb.parameters(), *self.ln_f.parameters())

    def positions(self, idx):
        rank, tp = comm.group_info(self.group)
        return super().positions(idx).chunk(tp)[rank]             # my part of the sequence


def sync_sequence_parallel_grads(model: nn.Module, group=None) -> None:
    """Sum over the group the gradients that are partial sums under sequence parallelism
    (layer norms, position embedding, row-parallel biases); nothing to do without them."""
    comm.all_reduce_flat([p.grad for p in model.parameters()
                          if getattr(p, "sequence_parallel_partial", False)], group,
                         phase="grads")


def mark_partial(*params) -> None:
    """Mark parameters whose gradient on one rank covers only its part of the sequence."""
    for p in params:
        if p is not None:
            p.sequence_parallel_partial = True
