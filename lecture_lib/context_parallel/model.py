"""A GPT whose attention runs context-parallel: every rank holds a slice of the sequence.

Everything in a transformer but attention works token by token, so with the
sequence split over the cp ranks (:mod:`.layout`) the embeddings, layer norms,
MLPs, the head and the loss run on the local tokens unchanged; only attention
needs the other ranks' keys and values (:class:`.ring.RingAttention` or
:class:`.ulysses.UlyssesAttention`). Two details make it equal to one process:

* positions: the position embedding looks up the *global* positions of the
  local tokens (:class:`LayoutPositionEmbedding`);
* gradients: every cp rank holds the full weights and computes the gradient
  of the mean loss over its own tokens; averaged over the cp group
  (``lecture_lib.comm.all_reduce_flat``, as data parallelism does) that is the
  gradient of the mean loss over the whole sequence (equal slices).

Parameter names stay the model's own (``blocks.0.attn.q.weight``), so the
result compares one to one with :class:`lecture_lib.models.GPT`.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..comm import all_reduce_flat, resolve
from ..models import GPT
from ..tensor_parallel.comm import copy_to_tensor_parallel
from .layout import check_layout, positions
from .ring import RingAttention
from .ulysses import UlyssesAttention, check_ulysses

METHODS = {"ring": RingAttention, "ulysses": UlyssesAttention}


def parallelize_gpt(gpt: GPT, group=None, layout: str = "zigzag", method: str = "ring",
                    kernel: str = "blockwise") -> GPT:
    """Make ``gpt`` (in place) take this rank's slice of each sequence; returns it. Every
    block attends through one :func:`make_attention` (its slices checked once per shape)."""
    _, rank, cp = resolve(group)
    check_context_parallel(gpt.cfg, cp, layout, method)
    gpt.pos_emb = LayoutPositionEmbedding(gpt.pos_emb, positions(rank, cp, gpt.cfg.seq_len, layout))
    attend = make_attention(method, group, layout, True, kernel)
    for block in gpt.blocks:
        block.attn = ContextParallelAttention(block.attn, attend)
    return gpt


class ContextParallelAttention(nn.Module):
    """An attention module's own projections; the score-softmax-value step by ``attend``
    (:class:`.ring.RingAttention` or :class:`.ulysses.UlyssesAttention`) over the cp group."""

    def __init__(self, attn: nn.Module, attend):
        super().__init__()
        self.q, self.k, self.v, self.proj = attn.q, attn.k, attn.v, attn.proj
        self.head_dim = attn.head_dim
        self.attend = attend

    def forward(self, x):
        b, t, _ = x.shape
        projections = (self.q, self.k, self.v)
        if hasattr(self.q, "my_columns"):    # tensor-parallel projections: f once for all three
            x = copy_to_tensor_parallel(x, self.q.group)
            projections = tuple(lin.my_columns for lin in projections)
        q, k, v = (lin(x).view(b, t, -1, self.head_dim).transpose(1, 2) for lin in projections)
        y = self.attend(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


def make_attention(method: str, group=None, layout: str = "zigzag", causal: bool = True,
                   kernel: str = "blockwise"):
    """Attention over the cp group by ``method``: ``"ring"`` (whose block ``kernel`` is
    ``"blockwise"`` or ``"flash"``) or ``"ulysses"`` (torch's SDPA on whole heads)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, not {method!r}")
    if method == "ring":
        return RingAttention(group, layout, causal, kernel)
    return UlyssesAttention(group, layout, causal)


def check_context_parallel(cfg, cp: int, layout: str = "zigzag", method: str = "ring",
                           tp: int = 1) -> None:
    """Every check that can be made before a process starts."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, not {method!r}")
    check_layout(cfg.seq_len, cp, layout)
    if method == "ulysses":
        check_ulysses(cfg.n_heads // tp, cp, max(cfg.n_kv_heads // tp, 1))


class LayoutPositionEmbedding(nn.Module):
    """The position embedding at the global positions of this rank's tokens (same weight)."""

    def __init__(self, embedding: nn.Embedding, positions: torch.Tensor):
        super().__init__()
        self.weight = embedding.weight
        self.register_buffer("positions", positions.to(embedding.weight.device), persistent=False)

    def forward(self, local_pos):
        return F.embedding(self.positions[local_pos], self.weight)


def sync_context_parallel_grads(model: nn.Module, group=None) -> None:
    """Average the parameter gradients over the cp group (every cp rank holds the weights)."""
    all_reduce_flat([p.grad for p in model.parameters()], group, average=True, phase="grads")

