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
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def causal_mask(tq: int, tk: int, device=None) -> torch.Tensor:
    """``mask[i, j]`` is True where query ``i`` may see key ``j`` of the same chunk (j <= i)."""
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril()


def _scores(q, k, mask, scale):
    s = (q @ k.transpose(-2, -1)) * scale
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def block_attention(q, k, v, mask: torch.Tensor | None = None, scale: float | None = None):
    """``(o, lse)`` of queries ``q`` (..., tq, d) against one block ``k``, ``v`` (..., tk, d)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = _scores(q, k, mask, scale)
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def merge(o_a, lse_a, o_b, lse_b):
    """The online-softmax merge of two partial results over disjoint key blocks."""
    lse = torch.logaddexp(lse_a, lse_b)
    o = torch.exp(lse_a - lse).unsqueeze(-1) * o_a + torch.exp(lse_b - lse).unsqueeze(-1) * o_b
    return o, lse


def block_attention_backward(q, k, v, o, lse, do, mask=None, scale: float | None = None):
    """``(dq, dk, dv)``: one block's share of the gradients, from the row's final ``o``, ``lse``."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    p = torch.exp(_scores(q, k, mask, scale) - lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ do
    ds = p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True))
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv


def attention_reference(q, k, v, causal: bool = True):
    """One softmax over every key, in one process: what every scheme must equal."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
