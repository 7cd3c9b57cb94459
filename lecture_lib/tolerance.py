"""How far apart two runs of the same computation may land: tolerances from rounding alone.

Two runs that compute the same thing in another order or with other kernels (a batch split
over ranks, a reduce-scatter instead of one sum, oneDNN's AMX-BF16 kernels on one CPU and its
AVX2 kernels on another) differ by rounding alone. How much is not a property of one machine:
it follows from the format and from how many roundings the value went through.

* Each rounding to a format with unit roundoff ``u`` (half its machine epsilon: 2^-8 for
  bf16, 2^-11 for fp16, 2^-24 for fp32) errs by at most ``u`` relatively.
* ``depth`` is the number of roundings in that format behind the compared value, in sequence:
  each operation rounds its output once, and a sum accumulated in the format rounds once per
  term. torch accumulates 16-bit matrix products and reductions in fp32 on CPUs and GPUs, so
  for 16-bit compute the depth is the operations in the chain (forward and backward through
  the model) plus the ranks whose 16-bit values one collective adds in 16 bits; for fp32 it
  is the chain times the longest sum.
* Rounding errors that behave as independent random variables of mean zero grow as
  ``lam * sqrt(depth) * u``: Higham & Mary, "A new approach to probabilistic rounding error
  analysis", SIAM J. Sci. Comput. 41(5), 2019, Theorem 3.1, which holds with probability at
  least ``1 - 2 depth exp(-lam^2 (1-u)^2 / 2)``. ``lam`` is chosen here so that this failure
  probability is ``FAILURE``; the worst case, ``depth * u``, is far too loose to test with.
* Two runs each within that bound of the exact value are within twice it of each other.

So ``rtol(dtype, depth) = 2 * lam(depth) * sqrt(depth) * u(dtype)``, relative to the scale of
the compared value. A value whose exact value is zero while its computed value is rounding
noise (the attention key bias's gradient: softmax ignores a shift shared by all keys) has no
scale of its own: ``scale_floor`` gives such values the model's typical scale instead.
"""
from __future__ import annotations

import math

import torch

FAILURE = 1e-3          # the chance that one compared value exceeds its bound by rounding alone

# Operations one GPT block puts in sequence, each rounding its output once: forward LN, QKV,
# scores, softmax, weighted values, projection, residual add, LN, FC, GELU, FC, residual add;
# the backward pass runs the same chain again.
GPT_BLOCK_OPS = 2 * 12
GPT_OUTER_OPS = 2 * 4   # embedding, final LN, head, loss; forward and backward


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2: the largest relative error of one rounding to ``dtype``."""
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"unit_roundoff needs a floating-point torch.dtype, got {dtype!r}")
    return torch.finfo(dtype).eps / 2


def spread(depth: int) -> float:
    """lam such that 2 * depth * exp(-lam^2 / 2) = FAILURE (Higham & Mary 2019, Thm 3.1)."""
    return math.sqrt(2 * math.log(2 * depth / FAILURE))


def rtol(dtype: torch.dtype, depth: int) -> float:
    """Relative tolerance between two runs that round ``depth`` times in ``dtype`` each."""
    if not (isinstance(depth, int) and depth >= 1):
        raise ValueError(f"depth is a number of roundings (an int >= 1), got {depth!r}")
    return 2 * spread(depth) * math.sqrt(depth) * unit_roundoff(dtype)


def gpt_depth(n_layers: int, world_size: int = 1) -> int:
    """The 16-bit depth of one training step of the course's GPT on ``world_size`` ranks."""
    if n_layers < 1 or world_size < 1:
        raise ValueError(f"n_layers and world_size must be >= 1, got {n_layers}, {world_size}")
    return GPT_BLOCK_OPS * n_layers + GPT_OUTER_OPS + world_size


def scale_floor(tensors: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per tensor, max(its norm, the norm it would have at the RMS of all of them).

    The scale to compare a difference against, for each of several tensors: its own norm,
    unless it is smaller than a tensor of its size with the typical element of the whole set
    (then it holds rounding noise, not signal, and the typical element is the scale).
    """
    count = sum(t.numel() for t in tensors.values())
    if count == 0:
        raise ValueError("scale_floor needs at least one element")
    rms = math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors.values()) / count)
    return {k: max(float(t.detach().double().norm()), rms * math.sqrt(t.numel()))
            for k, t in tensors.items()}
