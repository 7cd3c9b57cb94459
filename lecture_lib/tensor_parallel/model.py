"""The GPT split over a tensor-parallel group: blocks, the whole model, its gradients.

:class:`TensorParallelGPT` is :class:`lecture_lib.models.GPT` with every
matrix split as in Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053): the
token embedding and the output layer over the vocabulary, attention by
heads, the MLP by columns then rows; layer norms and the position embedding
are replicated. Under sequence parallelism (Korthikanti et al. 2022,
arXiv:2205.05198) those replicated weights see only this rank's part of the
sequence, so their gradients are partial sums:
:func:`sync_sequence_parallel_grads` adds them up over the group.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from .. import comm, models
from ..runtime import device as rank_device
from .comm import all_gather
from .layers import ColumnParallelLinear, ParallelMLP, ParallelSelfAttention, VocabParallelEmbedding
from .loss import vocab_parallel_cross_entropy


def _replicated(module: nn.Module, sequence_parallel: bool) -> nn.Module:
    """A copy of ``module`` on every rank (layer norms, position embedding)."""
    out, device = copy.deepcopy(module), rank_device()
    if any(p.device != device for p in out.parameters()):   # (moving a fake module fails)
        out = out.to(device)
    for p in out.parameters():
        p.tp_dim = None
        if sequence_parallel:
            p.sequence_parallel_partial = True
    return out


class ParallelBlock(nn.Module):
    """A pre-norm transformer block with attention and MLP split across the group."""

    def __init__(self, block: models.Block, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.ln1 = _replicated(block.ln1, sequence_parallel)
        self.attn = ParallelSelfAttention(block.attn, group, sequence_parallel)
        self.ln2 = _replicated(block.ln2, sequence_parallel)
        self.mlp = ParallelMLP(block.mlp, group, sequence_parallel)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def check_tensor_parallel(cfg: models.GPTConfig, tp: int, sequence_parallel: bool = False) -> None:
    """Clear error, before any process starts, unless ``cfg`` splits evenly over ``tp`` ranks."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor-parallel size must be a whole number >= 1, not {tp!r}")
    for what, n in (("n_heads", cfg.n_heads), ("d_ff", cfg.d_ff), ("vocab_size", cfg.vocab_size),
                    ("d_model", cfg.d_model)):
        if n % tp:
            raise ValueError(f"{what}={n} is not divisible by tensor-parallel size {tp}")
    if sequence_parallel and cfg.seq_len % tp:
        raise ValueError(f"sequence parallelism: seq_len={cfg.seq_len} is not divisible by "
                         f"tensor-parallel size {tp}")


class TensorParallelGPT(nn.Module):
    """:class:`models.GPT` split over ``group``: same names, same maths, ``1/tp`` of the weights.

    ``model(idx)`` gives this rank's slice of the logits (``vocab / tp``
    columns; no rank holds them all); ``model(idx, targets)`` the mean loss,
    through :func:`vocab_parallel_cross_entropy`.
    """

    def __init__(self, gpt: models.GPT, group=None, sequence_parallel: bool = False):
        super().__init__()
        cfg = gpt.cfg
        check_tensor_parallel(cfg, comm.group_info(group)[1], sequence_parallel)
        self.cfg, self.group, self.sequence_parallel = cfg, group, sequence_parallel
        self.tok_emb = VocabParallelEmbedding(gpt.tok_emb, group, sequence_parallel)
        self.pos_emb = _replicated(gpt.pos_emb, sequence_parallel)
        self.blocks = nn.ModuleList(ParallelBlock(b, group, sequence_parallel) for b in gpt.blocks)
        self.ln_f = _replicated(gpt.ln_f, sequence_parallel)
        self.head = ColumnParallelLinear.from_linear(gpt.head, group,
                                                     sequence_parallel=sequence_parallel)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        if self.sequence_parallel:                # this rank's part of the sequence
            rank, tp = comm.group_info(self.group)
            pos = pos.chunk(tp)[rank]
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return vocab_parallel_cross_entropy(logits, targets, self.group).mean()


def sync_sequence_parallel_grads(model: nn.Module, group=None) -> None:
    """Sum, over the group, the gradients of replicated weights that saw only part of the
    sequence (layer norms, position embedding, row-parallel biases) under sequence parallelism."""
    comm.all_reduce_flat([p.grad for p in model.parameters()
                          if getattr(p, "sequence_parallel_partial", False)], group,
                         phase="grads")


def gather_full(model: nn.Module, group=None, grads: bool = False) -> dict:
    """``{name: full tensor}`` of the parameters (or their gradients), split ones gathered."""
    out = {}
    for name, p in model.named_parameters():
        t = (p.grad if grads else p).detach()
        if getattr(p, "tp_dim", None) is not None:
            t = all_gather(t, group, p.tp_dim, phase="gather_full")
        out[name] = t.cpu().clone()
    return out
