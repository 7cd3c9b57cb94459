"""Memory-bound work: the operations between the matrix multiplies, at memory bandwidth.

A matrix multiply of an ``M x K`` by a ``K x N`` matrix does ``2 M K N`` FLOPs
on ``M K + K N + M N`` values: with enough tokens and width it is limited by
the device's FLOP rate. Everything else a transformer runs (layer norms,
residual adds, the activation function, the attention kernel's reads and
writes, the bias gradients, the optimizer update) does a few FLOPs per value
and is limited by memory bandwidth: on the roofline (Williams, Waterman &
Patterson 2009) it costs ``bytes read + bytes written`` over the bandwidth.
Ivanov et al. (2021, "Data Movement Is All You Need: A Case Study on
Optimizing Transformers", MLSys) found these operators a small share of a
transformer's FLOPs but a large share of its training time. Per token, their
traffic grows like ``h`` and the multiplies' FLOPs like ``h^2``: the smaller
the model, the more they matter.

Counted here for one pre-norm block of :class:`lecture_lib.models.GPT`
(``x + attn(ln1(x))``, ``x + mlp(ln2(x))``, fused attention, GELU MLP of
width ``4h``), in values of width ``h`` read plus written per token, each
operation reading its inputs and writing its outputs once:

=====================================  =======  ========  ===========
operation                              forward  backward  split by tp
=====================================  =======  ========  ===========
2 layer norms (x in, y out; backward:   4        6         no
   dy and x in, dx out)
2 residual adds (2 in, 1 out), and in   6        12        no
   backward 4 sums of two gradients
   (the residual forks, q/k/v's dx)
attention kernel (q, k, v in, o out;    4        8         yes
   backward: q, k, v, o, do in,
   dq, dk, dv out)
GELU on 4h (in, out; backward: dy and   8        12        yes
   x in, dx out)
bias gradients (a sum over tokens of    0        7 + 2     7 yes, 2 no
   q, k, v, fc1 (4h): 7; proj, fc2: 2)
=====================================  =======  ========  ===========

69 values per token per layer, 39 of them in the Megatron-split halves
(attention heads, MLP columns) and 30 replicated on every tp rank.

The optimizer reads and writes whole parameter tensors once per step: plain
SGD reads the weight and its gradient and writes the weight (3 values per
parameter); a fused AdamW reads weight, gradient and both moments and writes
weight and moments (7; torch's unfused kernels move more). Averaging the
gradients through one flat buffer (:func:`lecture_lib.comm.all_reduce_flat`)
copies them in, scales and copies them out (6 values per parameter).

Left out: the embeddings, the final norm and the loss (a few ``h`` per token
for the whole model, not per layer).
"""
from __future__ import annotations

from .memory import TransformerShape

LAYER_VALUES_SPLIT = 4 + 8 + 8 + 12 + 7       # attention kernel, GELU, column biases
LAYER_VALUES_REPLICATED = 4 + 6 + 6 + 12 + 2  # layer norms, residual adds and sums, row biases
OPTIMIZER_VALUES = {"sgd": 3, "adamw": 7}
FLAT_BUFFER_VALUES = 6


def layer_values(tp: int = 1) -> float:
    """Values of width ``h`` read and written per token and layer on one of ``tp`` ranks."""
    return LAYER_VALUES_REPLICATED + LAYER_VALUES_SPLIT / tp


def check_optimizer(optimizer: str) -> None:
    if optimizer not in OPTIMIZER_VALUES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_VALUES)}, "
                         f"not {optimizer!r}")


def optimizer_seconds(params: float, bandwidth: float, optimizer: str = "adamw",
                      value_bytes: int = 4) -> float:
    """One optimizer step over ``params`` parameters at the memory floor: each of its values
    read or written once at ``bandwidth`` bytes per second (a fused kernel's ideal)."""
    check_optimizer(optimizer)
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0 bytes per second, not {bandwidth!r}")
    return OPTIMIZER_VALUES[optimizer] * params * value_bytes / bandwidth


def memory_bound_seconds(shape: TransformerShape, dp: int, tp: int, pp: int, tokens: float,
                         bandwidth: float, optimizer: str = "adamw",
                         value_bytes: int = 4) -> dict:
    """Seconds per step of the memory-bound work on one device, by part.

    ``tokens`` is the global batch's tokens; each device sees ``tokens / dp`` of them in
    ``layers / pp`` layers, and holds ``1 / (tp pp)`` of the parameters. ``value_bytes``:
    bytes per value (4 for fp32 training as in the course's runs).
    """
    check_optimizer(optimizer)
    per_byte = value_bytes / bandwidth
    layers = shape.layers // pp
    params = shape.num_params / (tp * pp)
    return {
        "element-wise": layer_values(tp) * shape.hidden * tokens / dp * layers * per_byte,
        "optimizer": optimizer_seconds(params, bandwidth, optimizer, value_bytes),
        "gradient buffer": FLAT_BUFFER_VALUES * params * per_byte if dp > 1 else 0.0,
    }
