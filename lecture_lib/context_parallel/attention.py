"""Attention one block at a time, merged exactly with the online softmax.

Softmax attention over keys split into blocks ``K = [K_1, K_2, ...]`` need not
see all keys at once (Milakov & Gimelshein 2018, "Online normalizer
calculation for softmax"; Dao et al. 2022, FlashAttention; Liu et al. 2023,
"Ring Attention with Blockwise Transformers", section 3). For one query row
and one block ``j``, keep the block's normalised output and its log-sum-exp:

    s_j   = q K_j^T / sqrt(d)
    lse_j = log sum_k exp(s_jk)
    o_j   = softmax(s_j) V_j = sum_k exp(s_jk - lse_j) V_jk

Attention over the union of blocks ``a`` and ``b`` is then

    lse = log(exp(lse_a) + exp(lse_b))          (torch.logaddexp: no overflow)
    o   = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b

because ``exp(lse_a - lse)`` is exactly the share of the softmax mass that
block ``a`` holds. The merge is associative, so blocks may arrive in any
order (ring attention's K/V blocks do) and the result is the same as one
softmax over every key, up to floating-point rounding.

Backward of one block (FlashAttention's recomputation, Dao et al. 2022,
Algorithm 2), given the *final* ``o`` and ``lse`` of the row and ``do``:

    P   = exp(s_j - lse)        D = rowsum(do * o)
    dV_j = P^T do               dS = P * (do V_j^T - D)
    dQ  += dS K_j / sqrt(d)     dK_j = dS^T q / sqrt(d)

Two kernels compute a block: ``"blockwise"`` writes the formulas above out,
one operation each (:func:`block_attention`); ``"flash"`` runs them as one
fused kernel each way, torch's flash-attention kernel, which returns the
log-sum-exp too (:func:`flash_block_attention`). With grouped-query attention
(Ainslie et al. 2023) k and v have fewer heads than q: K/V head ``j`` serves
query heads ``j g .. j g + g - 1``, ``g = heads / kv heads``.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F


def block_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """``(o, lse)`` of queries ``q`` (..., tq, d) against one block ``k``, ``v`` (..., tk, d);
    ``causal``: query ``i`` sees keys ``j <= i`` only (a block on the diagonal)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    s = _scores(q, k, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def merge(o_a, lse_a, o_b, lse_b):
    """The online-softmax merge of two partial results over disjoint key blocks."""
    lse = torch.logaddexp(lse_a, lse_b)
    o = torch.exp(lse_a - lse).unsqueeze(-1) * o_a + torch.exp(lse_b - lse).unsqueeze(-1) * o_b
    return o, lse


def block_attention_backward(q, k, v, o, lse, do, causal: bool = False,
                             scale: float | None = None):
    """``(dq, dk, dv)``: one block's share of the gradients, from the row's final ``o``, ``lse``."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    kv_heads = k.shape[1]
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    p = torch.exp(_scores(q, k, causal, scale) - lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ do
    ds = p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True))
    dk = (ds.transpose(-2, -1) @ q) * scale
    return (ds @ k) * scale, sum_kv_groups(dk, kv_heads), sum_kv_groups(dv, kv_heads)


def flash_block_attention(q, k, v, causal: bool = False):
    """:func:`block_attention` as one fused kernel: torch's CPU flash-attention kernel, the one
    ``scaled_dot_product_attention`` runs on CPU (and the emulation times as attention)."""
    _on_cpu(q)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)


def flash_block_attention_backward(q, k, v, o, lse, do, causal: bool = False):
    """:func:`block_attention_backward` as one fused kernel (it recomputes P from ``lse``)."""
    _on_cpu(q)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        do, q, k, v, o, lse, 0.0, causal)


class BlockKernel(NamedTuple):
    """How one block is attended: ``forward(q, k, v, causal) -> (o, lse)`` and
    ``backward(q, k, v, o, lse, do, causal) -> (dq, dk, dv)``."""
    forward: Callable
    backward: Callable


KERNELS = {"blockwise": BlockKernel(block_attention, block_attention_backward),
           "flash": BlockKernel(flash_block_attention, flash_block_attention_backward)}


def attention_reference(q, k, v, causal: bool = True):
    """One softmax over every key, in one process: what every scheme must equal."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                          enable_gqa=k.shape[1] != q.shape[1])


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

def causal_mask(tq: int, tk: int, device=None) -> torch.Tensor:
    """``mask[i, j]`` is True where query ``i`` may see key ``j`` of the same chunk (j <= i)."""
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril()


def _scores(q, k, causal: bool, scale: float):
    s = (q @ k.transpose(-2, -1)) * scale
    if not causal:
        return s
    return s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))


def repeat_kv(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V (b, kv heads, t, d) with each head repeated for the ``heads / kv heads`` query
    heads it serves (grouped-query attention); unchanged when the head counts are equal."""
    groups = heads // kv.shape[1]
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


def sum_kv_groups(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The adjoint of :func:`repeat_kv`: a K/V head's gradient sums over the query heads it
    served."""
    heads = grad.shape[1]
    return grad if heads == kv_heads else grad.unflatten(1, (kv_heads, heads // kv_heads)).sum(2)


def check_kernel(kernel: str) -> None:
    """A clear ValueError unless ``kernel`` is one of :data:`KERNELS`."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {list(KERNELS)}, not {kernel!r}")


def _on_cpu(q: torch.Tensor) -> None:
    if q.device.type != "cpu":
        raise ValueError(f"the 'flash' block kernel is torch's CPU flash-attention kernel (what "
                         f"the emulation and its dry run time); on {q.device.type} tensors use "
                         f"kernel='blockwise'")
