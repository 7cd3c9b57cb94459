"""A GPT whose attention runs context-parallel: every rank holds a slice of the sequence.

Everything in a transformer but attention works token by token, so with the
sequence split over the cp ranks (:mod:`.layout`) the embeddings, layer norms,
MLPs, the head and the loss run on the local tokens unchanged; only attention
needs the other ranks' keys and values (:func:`.ring.ring_attention` or
:func:`.ulysses.ulysses_attention`). Two details make it equal to one process:

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
from .layout import check_layout, positions
from .ring import ring_attention
from .ulysses import check_ulysses, ulysses_attention

METHODS = {"ring": ring_attention, "ulysses": ulysses_attention}


def check_context_parallel(cfg, cp: int, layout: str = "zigzag", method: str = "ring",
                           tp: int = 1) -> None:
    """Every check that can be made before a process starts."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, not {method!r}")
    check_layout(cfg.seq_len, cp, layout)
    if method == "ulysses":
        check_ulysses(cfg.n_heads // tp, cp)


class LayoutPositionEmbedding(nn.Module):
    """The position embedding at the global positions of this rank's tokens (same weight)."""

    def __init__(self, embedding: nn.Embedding, positions: torch.Tensor):
        super().__init__()
        self.weight = embedding.weight
        self.register_buffer("positions", positions.to(embedding.weight.device), persistent=False)

    def forward(self, local_pos):
        return F.embedding(self.positions[local_pos], self.weight)


def _projections(attn, x):
    """q, k, v projections of a plain or a tensor-parallel attention (which enters once)."""
    if hasattr(attn.q, "enter"):                 # tensor_parallel.ParallelSelfAttention
        x = attn.q.enter(x)
        return x, [lin.project(x) for lin in (attn.q, attn.k, attn.v)]
    return x, [lin(x) for lin in (attn.q, attn.k, attn.v)]


class ContextParallelAttention(nn.Module):
    """An attention module's own projections; the score-softmax-value step over the cp group."""

    def __init__(self, attn: nn.Module, group=None, layout: str = "zigzag", method: str = "ring"):
        super().__init__()
        self.q, self.k, self.v, self.proj = attn.q, attn.k, attn.v, attn.proj
        self.head_dim = attn.head_dim
        self.group, self.layout, self.attend = group, layout, METHODS[method]

    def forward(self, x):
        x, projected = _projections(self, x)
        b, t, _ = x.shape
        q, k, v = (p.view(b, t, -1, self.head_dim).transpose(1, 2) for p in projected)
        y = self.attend(q, k, v, self.group, self.layout, True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


def parallelize_gpt(gpt: GPT, group=None, layout: str = "zigzag", method: str = "ring") -> GPT:
    """Make ``gpt`` (in place) take this rank's slice of each sequence; returns it."""
    _, rank, cp = resolve(group)
    check_context_parallel(gpt.cfg, cp, layout, method)
    gpt.pos_emb = LayoutPositionEmbedding(gpt.pos_emb, positions(rank, cp, gpt.cfg.seq_len, layout))
    for block in gpt.blocks:
        block.attn = ContextParallelAttention(block.attn, group, layout, method)
    return gpt


def sync_context_parallel_grads(model: nn.Module, group=None) -> None:
    """Average the parameter gradients over the cp group (every cp rank holds the weights)."""
    all_reduce_flat([p.grad for p in model.parameters()], group, average=True, phase="grads")
