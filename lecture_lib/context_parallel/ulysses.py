"""DeepSpeed-Ulysses: all-to-all from sequence-sharded to head-sharded and back.

Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling
Training of Extreme Long Sequence Transformer Models", section 3. Each of the
``cp`` ranks holds ``seq_len / cp`` tokens of q, k and v for *all* heads. One
all-to-all per tensor regroups them so each rank holds *all* tokens of
``heads / cp`` heads; attention is then ordinary (every head is independent),
and one all-to-all sends the output back to sequence sharding:

              tokens                                 tokens
           t0  t1  t2  t3                         t0  t1  t2  t3
    heads  r0  r1  r2  r3   -- all-to-all -->  h0  r0  r0  r0  r0
    (all)  r0  r1  r2  r3                      h1  r1  r1  r1  r1   (rank r: heads r,
           r0  r1  r2  r3                      h2  r2  r2  r2  r2    every token)
           r0  r1  r2  r3                      h3  r3  r3  r3  r3

The limit: ``heads`` (and, with grouped-query attention, the K/V heads) must be
divisible by ``cp``. Communication per layer forward: four all-to-alls (q, k,
v, o) of a local buffer of ``b s h / cp`` elements, of which a rank sends
``(cp - 1) / cp``: ``4 (cp - 1) b s h / cp^2`` elements per rank, which falls
as cp grows, where ring attention's ``2 (cp - 1) b s h / cp`` does not (the
paper, section 3.2). The all-to-all is linear and its adjoint is the inverse
all-to-all, so backward is the same two moves reversed.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..comm import collective, resolve
from .layout import check_layout_name, positions


class UlyssesAttention:
    """Attention of this rank's slice (b, heads, t/cp, d) over the whole sequence, by heads.

    After the all-to-all the tokens sit in the layout's storage order (rank 0's
    slice, rank 1's, ...); under a causal mask they are put in sequence order for
    the kernel and back, so both layouts give the one-process result.
    """

    def __init__(self, group=None, layout: str = "contiguous", causal: bool = True):
        check_layout_name(layout)
        self.group, self.layout, self.causal = group, layout, causal

    def __call__(self, q, k, v):
        _, _, cp = resolve(self.group)
        self.check(q.shape, k.shape, v.shape)
        qh, kh, vh = (SeqToHeads.apply(x, self.group) for x in (q, k, v))
        order = self._sequence_order(qh.shape[-2], cp, q.device)
        if order is not None:                       # zig-zag: sequence order for the mask
            qh, kh, vh = (x.index_select(2, torch.argsort(order)) for x in (qh, kh, vh))
        y = F.scaled_dot_product_attention(qh, kh, vh, is_causal=self.causal,
                                           enable_gqa=kh.shape[1] != qh.shape[1])
        if order is not None:
            y = y.index_select(2, order)            # back to the layout's storage order
        return HeadsToSeq.apply(y, self.group)

    def check(self, q_shape, k_shape, v_shape, device=None) -> None:
        """The heads and K/V heads must split over the cp ranks (a local check, no message)."""
        check_ulysses(q_shape[1], resolve(self.group)[2], k_shape[1])

    def _sequence_order(self, seq_len: int, cp: int, device):
        """Global positions of the gathered tokens, or None where their order already is the
        sequence's (contiguous slices, or no mask to respect)."""
        if not self.causal or self.layout == "contiguous" or cp == 1:
            return None
        return torch.cat([positions(r, cp, seq_len, self.layout) for r in range(cp)]).to(device)


def ulysses_attention(q, k, v, group=None, layout: str = "contiguous", causal: bool = True):
    """One call of :class:`UlyssesAttention`."""
    return UlyssesAttention(group, layout, causal)(q, k, v)


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """(b, heads, t/cp, d) for all heads -> (b, heads/cp, t, d) for this rank's heads."""
    _, _, size = resolve(group)
    b, h, t, d = x.shape
    send = x.reshape(b, size, h // size, t, d).transpose(0, 1)       # [dest rank] first
    got = _all_to_all(send, group)                                   # [source rank] first
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // size, size * t, d)


def heads_to_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """(b, heads/cp, t, d) -> (b, heads, t/cp, d): the inverse of :func:`seq_to_heads`."""
    _, _, size = resolve(group)
    b, hl, t, d = x.shape
    send = x.reshape(b, hl, size, t // size, d).permute(2, 0, 1, 3, 4)
    got = _all_to_all(send, group)                                   # (src, b, hl, t/cp, d)
    return got.transpose(0, 1).reshape(b, size * hl, t // size, d)


class SeqToHeads(torch.autograd.Function):
    """:func:`seq_to_heads`; its backward is :func:`heads_to_seq`."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad):
        return heads_to_seq(grad, ctx.group), None


class HeadsToSeq(torch.autograd.Function):
    """:func:`heads_to_seq`; its backward is :func:`seq_to_heads`."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return seq_to_heads(grad, ctx.group), None


def check_ulysses(n_heads: int, cp: int, n_kv_heads: int | None = None) -> None:
    """A clear ValueError unless the heads (and the K/V heads) split evenly over the cp ranks."""
    for heads, what in ((n_heads, "heads"), (n_kv_heads, "K/V heads")):
        if heads is not None and heads % cp:
            raise ValueError(f"Ulysses needs the number of {what} divisible by cp: {heads} "
                             f"{what} do not split over cp={cp} ranks")


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """Chunk ``i`` of ``x``'s first dimension goes to rank ``i``; returns what came back."""
    group, _, size = resolve(group)
    x = x.contiguous()
    out = torch.empty_like(x)
    with collective("all_to_all", x.numel() * x.element_size(), size, device=x.device):
        dist.all_to_all_single(out, x, group=group)
    return out
