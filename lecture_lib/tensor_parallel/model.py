"""The GPT split over a tensor-parallel group: the block, the whole model, its parameters.

:class:`TensorParallelGPT` is :class:`lecture_lib.models.GPT` with every
matrix split as in Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053)::

    token embedding   rows of the vocabulary          g
    each block        attention by heads, MLP by columns then rows   f ... g, twice
    head              columns of the vocabulary (logits stay split)  f
    loss              vocabulary-parallel cross-entropy (:mod:`.loss`)

Layer norms and the position embedding are replicated: every rank holds a copy.
The sequence-parallel variants are in :mod:`.sequence_parallel`.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn as nn

from .. import comm, models
from ..runtime import device as rank_device
from .comm import all_gather
from .layers import ColumnParallelLinear, ParallelMLP, ParallelSelfAttention, VocabParallelEmbedding
from .loss import vocab_parallel_lm_loss


class ParallelBlock(nn.Module):
    """A pre-norm transformer block with attention and MLP split across the group."""
    Attention, MLP = ParallelSelfAttention, ParallelMLP

    def __init__(self, block: models.Block, group=None):
        super().__init__()
        self.ln1 = replicated(block.ln1)
        self.attn = self.Attention(block.attn, group)
        self.ln2 = replicated(block.ln2)
        self.mlp = self.MLP(block.mlp, group)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TensorParallelGPT(nn.Module):
    """:class:`models.GPT` split over ``group``: same names, same maths, ``1/tp`` of the weights.

    ``model(idx)`` gives this rank's slice of the logits (``vocab / tp``
    columns; no rank holds them all); ``model(idx, targets)`` the mean loss,
    through :func:`vocab_parallel_cross_entropy`.
    """
    Embedding, Block, Head = VocabParallelEmbedding, ParallelBlock, ColumnParallelLinear

    def __init__(self, gpt: models.GPT, group=None):
        super().__init__()
        cfg = gpt.cfg
        check_tensor_parallel(cfg, comm.group_info(group)[1])
        self.cfg, self.group = cfg, group
        self.tok_emb = self.Embedding(gpt.tok_emb, group)
        self.pos_emb = replicated(gpt.pos_emb)
        self.blocks = nn.ModuleList(self.Block(b, group) for b in gpt.blocks)
        self.ln_f = replicated(gpt.ln_f)
        self.head = self.Head.from_linear(gpt.head, group)

    def forward(self, idx, targets=None):
        x = self.tok_emb(idx) + self.pos_emb(self.positions(idx))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return vocab_parallel_lm_loss(logits, targets, self.group)

    def positions(self, idx):
        """The positions of the tokens this rank embeds."""
        return torch.arange(idx.shape[1], device=idx.device)


def check_tensor_parallel(cfg: models.GPTConfig, tp: int, sequence_parallel: bool = False) -> None:
    """Clear error, before any process starts, unless ``cfg`` splits evenly over ``tp`` ranks."""
    check_block_split(cfg, tp, sequence_parallel)
    if cfg.vocab_size % tp:
        raise ValueError(f"vocab_size={cfg.vocab_size} is not divisible by tensor-parallel "
                         f"size {tp}")


def check_block_split(cfg: models.GPTConfig, tp: int, sequence_parallel: bool = False) -> None:
    """:func:`check_tensor_parallel` for one block alone (the vocabulary aside)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor-parallel size must be a whole number >= 1, not {tp!r}")
    for what, n in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads), ("d_ff", cfg.d_ff),
                    ("d_model", cfg.d_model)):
        if n % tp:
            raise ValueError(f"{what}={n} is not divisible by tensor-parallel size {tp}")
    if sequence_parallel and cfg.seq_len % tp:
        raise ValueError(f"sequence parallelism: seq_len={cfg.seq_len} is not divisible by "
                         f"tensor-parallel size {tp}")


def replicated(module: nn.Module) -> nn.Module:
    """A copy of ``module`` on every rank (layer norms, position embedding)."""
    with warnings.catch_warnings():     # torch warns when a dry run's fake module is copied
        warnings.filterwarnings("ignore", "Accessing the data pointer of FakeTensor")
        out = copy.deepcopy(module)
    device = rank_device()
    if any(p.device != device for p in out.parameters()):   # (moving a fake module fails)
        out = out.to(device)
    for p in out.parameters():
        p.tp_dim = None
    return out


def gather_full(model: nn.Module, group=None, grads: bool = False) -> dict:
    """``{name: full tensor}`` of the parameters (or their gradients), split ones gathered."""
    out = {}
    for name, p in model.named_parameters():
        t = (p.grad if grads else p).detach()
        if getattr(p, "tp_dim", None) is not None:
            t = all_gather(t, group, p.tp_dim, phase="gather_full")
        out[name] = t.cpu().clone()
    return out
