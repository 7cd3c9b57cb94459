"""Ring attention: keys and values travel around the cp ranks (Liu et al. 2023).

Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context", section 3; the Ultra-Scale Playbook's chapter on
context parallelism. Every rank holds its slice of the queries, keys and
values (:mod:`.layout`). In ``cp`` steps each rank sees every K/V block once:

    step s: rank r holds the K/V block that rank (r - s) mod cp started with;
            it *first posts* the exchange that passes this block to rank r+1 and
            receives the next one from rank r-1 (one batched isend/irecv), *then*
            attends its queries to the block it holds (the exchange runs while
            it computes), and merges the partial result with the online softmax
            (:func:`.attention.merge`), so the result is exact.

Under a causal mask, a (query chunk, key chunk) pair with the key chunk later
than the query chunk is skipped entirely; the diagonal pair is masked.

Backward runs the ring again (:class:`RingAttention`): each K/V block travels
with an accumulator of its gradients dK, dV; every rank adds its share
(:func:`.attention.block_attention_backward`) and passes both on; after ``cp``
steps the accumulator is back home. Per layer one rank sends (cp - 1) K/V
blocks forward, and (cp - 1) K/V blocks plus cp dK/dV blocks backward.

Every send is recorded through ``lecture_lib.comm.collective`` (kind
``"send"``, the bytes of one message) when a recorder is on.

Before the first K/V block moves, :func:`ring_attention` checks the slices
(:func:`check_ring_inputs`): each rank's ``q``, ``k``, ``v`` must have one
shape, every rank the same one (a received block must fit the buffer posted
for it), and the token count must fit the layout (zig-zag: two equal chunks).
A rank cannot see the others' shapes, so the ranks first all-gather theirs
(12 numbers, phase ``"check"``) and every rank then reaches the same verdict:
the same ValueError on all of them, and none is left waiting for a message.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm import all_gather_into, collective, resolve
from .attention import block_attention, block_attention_backward, causal_mask, merge
from .layout import check_layout_name, check_slice_tokens, rank_chunks


def block_pairs(rank: int, source: int, cp: int, layout: str = "zigzag",
                causal: bool = True) -> list[tuple[int, int, str]]:
    """``(my chunk, their chunk, "full" | "diag")`` rank computes against ``source``'s K/V.

    Indices are positions in each rank's chunk list (:func:`.layout.rank_chunks`);
    a key chunk later than the query chunk is skipped under a causal mask.
    """
    pairs = []
    for i, qc in enumerate(rank_chunks(rank, cp, layout)):
        for j, kc in enumerate(rank_chunks(source, cp, layout)):
            if not causal or kc < qc:
                pairs.append((i, j, "full"))
            elif kc == qc:
                pairs.append((i, j, "diag"))
    return pairs


def ring_schedule(cp: int, layout: str = "zigzag", causal: bool = True) -> list[list[dict]]:
    """``schedule[step][rank]``: the K/V block held (its ``source`` rank) and the pairs computed."""
    return [[{"source": (r - s) % cp, "pairs": block_pairs(r, (r - s) % cp, cp, layout, causal)}
             for r in range(cp)] for s in range(cp)]


def _shape_code(t: torch.Tensor) -> list[int]:
    """Four numbers: the shape of a 4-D tensor, or ``[-1, ndim, 0, 0]`` for any other."""
    return list(t.shape) if t.dim() == 4 else [-1, t.dim(), 0, 0]


def _describe(code: list[int]) -> str:
    return f"a {code[1]}-D tensor" if code[0] < 0 else str(tuple(code))


def gather_slice_shapes(q, k, v, group=None) -> list[list[list[int]]]:
    """``shapes[rank] == [q, k, v]`` shape codes of every rank: one all-gather of 12 numbers."""
    group, _, size = resolve(group)
    mine = torch.tensor([n for t in (q, k, v) for n in _shape_code(t)], device=q.device)
    everyone = mine
    if size > 1:
        everyone = torch.empty(size * mine.numel(), dtype=mine.dtype, device=q.device)
        all_gather_into(everyone, mine, group, phase="check")
    return [[row[i:i + 4] for i in (0, 4, 8)] for row in everyone.view(size, -1).tolist()]


def check_ring_slices(shapes: list[list[list[int]]], layout: str = "zigzag",
                      ranks: list[int] | None = None) -> None:
    """A ValueError unless every rank holds q, k, v of one 4-D shape, the same on every rank,
    with a token count that fits ``layout``. ``shapes``: :func:`gather_slice_shapes`;
    ``ranks``: the global rank of each (default: their index)."""
    ranks = list(range(len(shapes))) if ranks is None else ranks
    odd = [f"rank {r}: q {_describe(q)}, k {_describe(k)}, v {_describe(v)}"
           for r, (q, k, v) in zip(ranks, shapes) if q[0] < 0 or not q == k == v]
    if odd:
        raise ValueError("ring attention needs q, k and v of one shape (batch, heads, tokens, "
                         "head_dim) on each rank: " + "; ".join(odd))
    if any(q != shapes[0][0] for q, _, _ in shapes):
        held = ", ".join(f"rank {r}: {q[2]} tokens {_describe(q)}"
                         for r, (q, _, _) in zip(ranks, shapes))
        raise ValueError("ring attention needs slices of the same shape on every rank (each "
                         "rank's K/V block travels to the others): " + held)
    check_slice_tokens(shapes[0][0][2], layout)


def check_ring_inputs(q, k, v, group=None, layout: str = "zigzag") -> None:
    """Every rank's slices checked together (the same ValueError on every rank), before any
    K/V message: the layout's name here, then one all-gather of the shapes."""
    check_layout_name(layout)
    group, _, size = resolve(group)
    ranks = None if group is None else [dist.get_global_rank(group, r) for r in range(size)]
    check_ring_slices(gather_slice_shapes(q, k, v, group), layout, ranks)


def ring_shift(t: torch.Tensor, group=None, phase: str = ""):
    """Post: send ``t`` to the next rank, receive the previous one's; ``wait() -> received``."""
    group, rank, size = resolve(group)
    if size == 1:
        return lambda: t
    recv = torch.empty_like(t)
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    ops = [dist.P2POp(dist.isend, t.contiguous(), peer((rank + 1) % size), group),
           dist.P2POp(dist.irecv, recv, peer((rank - 1) % size), group)]
    with collective("send", t.numel() * t.element_size(), size, phase, t.device):
        works = dist.batch_isend_irecv(ops)

    def wait():
        for w in works:
            w.wait()
        return recv
    return wait


def _mask(kind: str, q, k):
    return causal_mask(q.shape[-2], k.shape[-2], q.device) if kind == "diag" else None


def ring_forward(q, k, v, group=None, layout: str = "zigzag", causal: bool = True):
    """``(o, lse)`` of this rank's queries against every rank's keys, by the ring."""
    _, rank, size = resolve(group)
    n = len(rank_chunks(rank, size, layout))
    qs, states = q.chunk(n, -2), [None] * n
    kv = torch.stack([k, v])
    for step in range(size):
        pending = ring_shift(kv, group, "forward") if step < size - 1 else None
        ks, vs = kv[0].chunk(n, -2), kv[1].chunk(n, -2)
        for i, j, kind in block_pairs(rank, (rank - step) % size, size, layout, causal):
            part = block_attention(qs[i], ks[j], vs[j], _mask(kind, qs[i], ks[j]))
            states[i] = part if states[i] is None else merge(*states[i], *part)
        if pending is not None:
            kv = pending()
    return torch.cat([s[0] for s in states], -2), torch.cat([s[1] for s in states], -1)


def ring_backward(q, k, v, o, lse, do, group=None, layout: str = "zigzag", causal: bool = True):
    """``(dq, dk, dv)``: the ring again, each K/V block travelling with its dK/dV."""
    _, rank, size = resolve(group)
    n = len(rank_chunks(rank, size, layout))
    qs, os_, lses, dos = q.chunk(n, -2), o.chunk(n, -2), lse.chunk(n, -1), do.chunk(n, -2)
    dq = [torch.zeros_like(x) for x in qs]
    kv, dkv = torch.stack([k, v]), torch.zeros((2, *k.shape), dtype=k.dtype, device=k.device)
    for step in range(size):
        pending = ring_shift(kv, group, "backward") if step < size - 1 else None
        ks, vs = kv[0].chunk(n, -2), kv[1].chunk(n, -2)
        dks, dvs = dkv[0].chunk(n, -2), dkv[1].chunk(n, -2)
        for i, j, kind in block_pairs(rank, (rank - step) % size, size, layout, causal):
            g = block_attention_backward(qs[i], ks[j], vs[j], os_[i], lses[i], dos[i],
                                         _mask(kind, qs[i], ks[j]))
            dq[i] += g[0]
            dks[j].add_(g[1])
            dvs[j].add_(g[2])
        dkv = ring_shift(dkv, group, "backward")()         # the accumulator moves on with K/V
        if pending is not None:
            kv = pending()
    return torch.cat(dq, -2), dkv[0], dkv[1]


class RingAttention(torch.autograd.Function):
    """Ring attention forward, and the ring again for its exact backward."""

    @staticmethod
    def forward(ctx, q, k, v, group, layout, causal):
        o, lse = ring_forward(q, k, v, group, layout, causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (group, layout, causal)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, o, lse, do.contiguous(), *ctx.args)
        return dq, dk, dv, None, None, None


def ring_attention(q, k, v, group=None, layout: str = "zigzag", causal: bool = True):
    """Attention of this rank's ``q`` (batch, heads, tokens, head_dim) over the whole sequence.

    ``q``, ``k``, ``v`` are this rank's slice in ``layout`` (:mod:`.layout`); the
    output is this rank's slice of the one-process attention output. The slices are
    checked first, on every rank together (:func:`check_ring_inputs`).
    """
    check_ring_inputs(q, k, v, group, layout)
    return RingAttention.apply(q, k, v, group, layout, causal)
