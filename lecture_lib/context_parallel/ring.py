"""Ring attention: keys and values travel around the cp ranks (Liu et al. 2023).

Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context", section 3; the Ultra-Scale Playbook's chapter on
context parallelism. Every rank holds its slice of the queries, keys and
values (:mod:`.layout`); its queries stay, its K/V block goes around:

        rank 0          rank 1          rank 2          rank 3
       Q0  KV0  -----> Q1  KV1  -----> Q2  KV2  -----> Q3  KV3
             ^                                               |
             +------ each K/V block moves one rank a step ---+

        K/V block held    step 0   step 1   step 2   step 3
        rank 0            KV0      KV3      KV2      KV1
        rank 1            KV1      KV0      KV3      KV2      (rank r, step s: KV(r - s))
        rank 2            KV2      KV1      KV0      KV3
        rank 3            KV3      KV2      KV1      KV0

At each step a rank first *posts* the exchange that passes its block on and
receives the next one (:func:`ring_shift`), then attends its queries to the
block it holds while the exchange is in flight, and merges the partial result
with the online softmax (:func:`.attention.merge`): exact, whatever the order.
Under a causal mask a (query chunk, key chunk) pair whose keys all come later
is skipped, and the pair on the diagonal is masked (:func:`block_pairs`).

Backward runs the ring again: each K/V block travels with an accumulator of
its gradients dK, dV; every rank adds its share and passes both on; after
``cp`` steps the accumulator is back home. Per layer one rank sends (cp - 1)
K/V blocks forward, and (cp - 1) K/V blocks plus cp dK/dV blocks backward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor

from ..comm import all_gather_into, collective, resolve
from .attention import KERNELS, check_kernel, merge
from .layout import check_layout_name, check_slice_tokens, rank_chunks


class RingAttention:
    """Attention of this rank's slice over the cp group's whole sequence, by the ring.

    ``attend = RingAttention(group, "zigzag")``, then ``o = attend(q, k, v)`` in
    every layer: ``q`` (batch, heads, tokens, head_dim) is this rank's slice in
    ``layout``, ``k`` and ``v`` too (with grouped-query attention, fewer heads);
    ``o`` is this rank's slice of the one-process output. ``kernel`` attends one
    block (:data:`.attention.KERNELS`). The first call with a new shape checks
    every rank's slices together (:meth:`check`).
    """

    def __init__(self, group=None, layout: str = "zigzag", causal: bool = True,
                 kernel: str = "blockwise"):
        check_layout_name(layout)
        check_kernel(kernel)
        self.group, self.layout, self.causal = group, layout, causal
        self.kernel = KERNELS[kernel]
        self.checked: set = set()           # the slice shapes every rank has agreed on

    def __call__(self, q, k, v):
        self.check(q.shape, k.shape, v.shape, q.device)
        return RingFunction.apply(q, k, v, self)

    def forward(self, q, k, v):
        """``(o, lse)`` of this rank's queries against every rank's keys: cp steps."""
        _, rank, cp = resolve(self.group)
        n = len(rank_chunks(rank, cp, self.layout))            # chunks per rank: 1 or 2
        qs, states = q.chunk(n, -2), [None] * n
        kv = torch.stack([k, v])                               # one message carries both
        for step in range(cp):
            # post the exchange first, so the next block travels while this one is attended
            incoming = ring_shift(kv, self.group) if step < cp - 1 else None
            ks, vs = kv[0].chunk(n, -2), kv[1].chunk(n, -2)
            # the pairs this block needs: under the causal mask, later key chunks are skipped
            for i, j, kind in block_pairs(rank, (rank - step) % cp, cp, self.layout, self.causal):
                part = self.kernel.forward(qs[i], ks[j], vs[j], causal=kind == "diag")
                states[i] = part if states[i] is None else merge(*states[i], *part)
            if incoming is not None:
                kv = incoming()                                # wait: the next block is here
        o = torch.cat([s[0] for s in states], -2)              # (the merge may widen o's dtype)
        return o.to(q.dtype), torch.cat([s[1] for s in states], -1)

    def backward(self, q, k, v, o, lse, do):
        """``(dq, dk, dv)``: the ring again, each K/V block travelling with its dK/dV."""
        _, rank, cp = resolve(self.group)
        n = len(rank_chunks(rank, cp, self.layout))
        qs, os_, lses, dos = q.chunk(n, -2), o.chunk(n, -2), lse.chunk(n, -1), do.chunk(n, -2)
        dq = [torch.zeros_like(x) for x in qs]
        kv, dkv = torch.stack([k, v]), torch.zeros((2, *k.shape), dtype=k.dtype, device=k.device)
        for step in range(cp):
            incoming = ring_shift(kv, self.group) if step < cp - 1 else None
            ks, vs = kv[0].chunk(n, -2), kv[1].chunk(n, -2)
            dks, dvs = dkv[0].chunk(n, -2), dkv[1].chunk(n, -2)
            for i, j, kind in block_pairs(rank, (rank - step) % cp, cp, self.layout, self.causal):
                g = self.kernel.backward(qs[i], ks[j], vs[j], os_[i], lses[i], dos[i],
                                         causal=kind == "diag")
                dq[i] += g[0]
                dks[j].add_(g[1])
                dvs[j].add_(g[2])
            # the accumulator moves on with its block; it could leave only now, so it is waited
            dkv = ring_shift(dkv, self.group)()
            if incoming is not None:
                kv = incoming()
        return torch.cat(dq, -2), dkv[0], dkv[1]

    def check(self, q_shape, k_shape, v_shape, device=None) -> None:
        """Once per shape: every rank's slice shapes, gathered (one all-gather of 12 numbers)
        and checked together, so every rank raises the same ValueError before any K/V block
        moves (a received block must fit the buffer posted for it)."""
        shapes = (tuple(q_shape), tuple(k_shape), tuple(v_shape))
        if shapes in self.checked:
            return
        group, _, size = resolve(self.group)
        ranks = None if group is None else [dist.get_global_rank(group, r) for r in range(size)]
        gathered = gather_slice_shapes(shapes, self.group, device)
        if gathered is not None:        # a dry run gathers nothing to read: its shapes are
            check_ring_slices(gathered, self.layout, ranks)     # the real run's, checked there
        self.checked.add(shapes)


class RingFunction(torch.autograd.Function):
    """Autograd's view of the ring: :meth:`RingAttention.forward`, and its exact backward."""

    @staticmethod
    def forward(ctx, q, k, v, ring: RingAttention):
        o, lse = ring.forward(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.ring = ring
        return o

    @staticmethod
    def backward(ctx, do):
        dq, dk, dv = ctx.ring.backward(*ctx.saved_tensors, do.contiguous())
        return dq, dk, dv, None


def ring_attention(q, k, v, group=None, layout: str = "zigzag", causal: bool = True,
                   kernel: str = "blockwise"):
    """One call of :class:`RingAttention` (its slices checked, as every new shape is)."""
    return RingAttention(group, layout, causal, kernel)(q, k, v)


def ring_shift(t: torch.Tensor, group=None):
    """Post: send ``t`` to the next rank, receive the previous one's; ``wait() -> received``."""
    group, rank, size = resolve(group)
    if size == 1:
        return lambda: t
    recv = torch.empty_like(t)
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    ops = [dist.P2POp(dist.isend, t.contiguous(), peer((rank + 1) % size), group),
           dist.P2POp(dist.irecv, recv, peer((rank - 1) % size), group)]
    with collective("send", t.numel() * t.element_size(), size, device=t.device):
        works = dist.batch_isend_irecv(ops)

    def wait():
        for w in works:
            w.wait()
        return recv
    return wait


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


# ----------------------------------------------------------------------------
# The slices' check (once per shape, see RingAttention.check)
# ----------------------------------------------------------------------------

def gather_slice_shapes(shapes, group=None, device=None) -> list[list[list[int]]]:
    """``out[rank] == [q, k, v]`` shape codes of every rank (four numbers each: the shape of a
    4-D tensor, ``[-1, ndim, 0, 0]`` otherwise), from this rank's ``shapes``; None in a dry
    run, whose all-gather moves no numbers (it is issued all the same, so both runs' clocks
    agree)."""
    group, _, size = resolve(group)
    mine = torch.tensor([n for s in shapes for n in _shape_code(s)], device=device)
    everyone = mine
    if size > 1:
        everyone = torch.empty(size * mine.numel(), dtype=mine.dtype, device=device)
        all_gather_into(everyone, mine, group)
    if isinstance(everyone, FakeTensor):            # the dry run's: a shape, no numbers
        return None
    return [[row[i:i + 4] for i in (0, 4, 8)] for row in everyone.view(size, -1).tolist()]


def check_ring_slices(shapes: list[list[list[int]]], layout: str = "zigzag",
                      ranks: list[int] | None = None) -> None:
    """A ValueError unless every rank holds 4-D q, k, v that fit each other (k and v of one
    shape, with q's batch, tokens and head size and a divisor of its heads), the same on
    every rank, with a token count that fits ``layout``. ``shapes``:
    :func:`gather_slice_shapes`; ``ranks``: the global rank of each (default: their index)."""
    ranks = list(range(len(shapes))) if ranks is None else ranks
    odd = [f"rank {r}: q {_describe(q)}, k {_describe(k)}, v {_describe(v)}"
           for r, (q, k, v) in zip(ranks, shapes) if not _slices_fit(q, k, v)]
    if odd:
        raise ValueError("ring attention needs q, k and v of one shape (batch, heads, tokens, "
                         "head_dim; k and v may have fewer heads, a divisor of q's) on each "
                         "rank: " + "; ".join(odd))
    if any(s != shapes[0] for s in shapes):
        held = ", ".join(f"rank {r}: {q[2]} tokens {_describe(q)}"
                         for r, (q, _, _) in zip(ranks, shapes))
        raise ValueError("ring attention needs slices of the same shape on every rank (each "
                         "rank's K/V block travels to the others): " + held)
    check_slice_tokens(shapes[0][0][2], layout)


def _slices_fit(q, k, v) -> bool:
    if min(q[0], k[0], v[0]) < 0 or k != v:
        return False
    return (q[0], q[2], q[3]) == (k[0], k[2], k[3]) and k[1] > 0 and q[1] % k[1] == 0


def _shape_code(shape) -> list[int]:
    return list(shape) if len(shape) == 4 else [-1, len(shape), 0, 0]


def _describe(code: list[int]) -> str:
    return f"a {code[1]}-D tensor" if code[0] < 0 else str(tuple(code))
