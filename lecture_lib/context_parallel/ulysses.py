"""DeepSpeed-Ulysses: all-to-all from sequence-sharded to head-sharded and back.

Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling
Training of Extreme Long Sequence Transformer Models", section 3. Each of the
``cp`` ranks holds ``seq_len / cp`` tokens of q, k and v for *all* heads. One
all-to-all per tensor regroups them so each rank holds *all* tokens of
``heads / cp`` heads; attention is then ordinary (every head is independent),
and one all-to-all sends the output back to sequence sharding. The limit:
``heads`` must be divisible by ``cp``.

Communication per layer forward: four all-to-alls (q, k, v, o) of a local
buffer of ``b s h / cp`` elements, of which a rank sends ``(cp - 1) / cp``:
``4 (cp - 1) b s h / cp^2`` elements per rank, which falls as cp grows, where
ring attention's ``2 (cp - 1) b s h / cp`` does not (the paper, section 3.2).

The all-to-all is linear and its adjoint is the inverse all-to-all, so
backward is the same two moves reversed (:class:`_SeqToHeads`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..comm import collective, resolve
from .layout import positions


def check_ulysses(n_heads: int, cp: int) -> None:
    """A clear ValueError unless the heads split evenly over the cp ranks."""
    if n_heads % cp:
        raise ValueError(f"Ulysses needs the number of heads divisible by cp: {n_heads} heads "
                         f"do not split over cp={cp} ranks")


def _all_to_all(x: torch.Tensor, group, phase: str) -> torch.Tensor:
    """Chunk ``i`` of ``x``'s first dimension goes to rank ``i``; returns what came back."""
    group, _, size = resolve(group)
    x = x.contiguous()
    out = torch.empty_like(x)
    with collective("all_to_all", x.numel() * x.element_size(), size, phase, x.device):
        dist.all_to_all_single(out, x, group=group)
    return out


def seq_to_heads(x: torch.Tensor, group=None, phase: str = "forward") -> torch.Tensor:
    """(b, heads, t/cp, d) for all heads -> (b, heads/cp, t, d) for this rank's heads."""
    _, _, size = resolve(group)
    b, h, t, d = x.shape
    send = x.reshape(b, size, h // size, t, d).transpose(0, 1)       # [dest rank] first
    got = _all_to_all(send, group, phase)                            # [source rank] first
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // size, size * t, d)


def heads_to_seq(x: torch.Tensor, group=None, phase: str = "forward") -> torch.Tensor:
    """(b, heads/cp, t, d) -> (b, heads, t/cp, d): the inverse of :func:`seq_to_heads`."""
    _, _, size = resolve(group)
    b, hl, t, d = x.shape
    send = x.reshape(b, hl, size, t // size, d).permute(2, 0, 1, 3, 4)
    got = _all_to_all(send, group, phase)                            # (src, b, hl, t/cp, d)
    return got.transpose(0, 1).reshape(b, size * hl, t // size, d)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return seq_to_heads(x, group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return heads_to_seq(grad, ctx.group, "backward"), None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return heads_to_seq(x, group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return seq_to_heads(grad, ctx.group, "backward"), None


def ulysses_attention(q, k, v, group=None, layout: str = "contiguous", causal: bool = True):
    """Attention of this rank's slice (b, heads, t/cp, d) over the whole sequence, by heads.

    After the all-to-all the tokens sit in the layout's storage order
    (rank 0's slice, rank 1's, ...); the causal mask is built from their global
    positions, so both layouts give the one-process result.
    """
    _, _, size = resolve(group)
    check_ulysses(q.shape[1], size)
    qh, kh, vh = (_SeqToHeads.apply(x, group) for x in (q, k, v))
    mask = None
    if causal:
        seq = qh.shape[-2]
        pos = torch.cat([positions(r, size, seq, layout) for r in range(size)]).to(q.device)
        mask = pos.unsqueeze(0) <= pos.unsqueeze(1)                   # key pos <= query pos
    y = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    return _HeadsToSeq.apply(y, group)
