"""Tensor parallelism: one layer's matrices split across ranks (Megatron-LM).

Shoeybi et al. 2019 ("Megatron-LM: Training Multi-Billion Parameter Language
Models Using Model Parallelism", arXiv:1909.08053) split a linear layer's
weight by columns (each rank computes its own output columns, which are
concatenated) or by rows (each rank computes a partial product, which are
summed), and chain a column-parallel and a row-parallel layer so that the
pair communicates only at its edges, through the conjugate operators f and
g. Sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198) turns
each all-reduce into a reduce-scatter and an all-gather so that layer norms
and residuals work on ``1/tp`` of the tokens.

Read in this order:

* :mod:`.comm`: f, g and the sequence-parallel pairs, as named ``autograd.Function`` s;
* :mod:`.layers`: column- and row-parallel linear layers, MLP, attention, embedding;
* :mod:`.loss`: the vocabulary-parallel cross-entropy;
* :mod:`.model`: the block and the whole GPT;
* :mod:`.sequence_parallel`: the same layers with the all-gather / reduce-scatter pair;
* :mod:`.experiments`: training equal to one process, and notebook 04's measurements
  (real time, emulated, and the dry run at real size); imported by its module
  (``from lecture_lib.tensor_parallel import experiments as tpx``), the package
  exports only the algorithm above.

Bytes per block are counted through :func:`lecture_lib.comm.record_comm` and
compared with :mod:`lecture_lib.costmodel.tensor_parallel`.
"""
from .comm import (
    AllGatherFromSequenceParallelRegion,
    CopyToTensorParallelRegion,
    GatherFromTensorParallelRegion,
    ReduceFromTensorParallelRegion,
    ReduceScatterToSequenceParallelRegion,
    ScatterToTensorParallelRegion,
    all_gather_from_sequence_parallel,
    copy_to_tensor_parallel,
    gather_from_tensor_parallel,
    reduce_from_tensor_parallel,
    reduce_scatter_to_sequence_parallel,
    split_to_tensor_parallel,
)
from .layers import (
    ColumnParallelLinear,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    VocabParallelEmbedding,
    seeded_linear,
)
from .loss import VocabParallelCrossEntropy, vocab_parallel_cross_entropy, vocab_parallel_lm_loss
from .model import ParallelBlock, TensorParallelGPT, check_tensor_parallel, gather_full
from .sequence_parallel import (
    SequenceParallelBlock,
    SequenceParallelColumnLinear,
    SequenceParallelGPT,
    SequenceParallelMLP,
    SequenceParallelRowLinear,
    SequenceParallelSelfAttention,
    SequenceParallelVocabEmbedding,
    sync_sequence_parallel_grads,
)

__all__ = [
    "AllGatherFromSequenceParallelRegion", "ColumnParallelLinear", "CopyToTensorParallelRegion",
    "GatherFromTensorParallelRegion", "ParallelBlock", "ParallelMLP", "ParallelSelfAttention",
    "ReduceFromTensorParallelRegion", "ReduceScatterToSequenceParallelRegion",
    "RowParallelLinear", "ScatterToTensorParallelRegion", "SequenceParallelBlock",
    "SequenceParallelColumnLinear", "SequenceParallelGPT", "SequenceParallelMLP",
    "SequenceParallelRowLinear", "SequenceParallelSelfAttention",
    "SequenceParallelVocabEmbedding", "TensorParallelGPT", "VocabParallelCrossEntropy",
    "VocabParallelEmbedding", "all_gather_from_sequence_parallel", "check_tensor_parallel",
    "copy_to_tensor_parallel", "gather_from_tensor_parallel", "gather_full",
    "reduce_from_tensor_parallel", "reduce_scatter_to_sequence_parallel", "seeded_linear",
    "split_to_tensor_parallel", "sync_sequence_parallel_grads", "vocab_parallel_cross_entropy",
    "vocab_parallel_lm_loss",
]
