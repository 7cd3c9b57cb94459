"""A chunk's backward in two parts: B, the input gradient, and W, the weight gradients.

Every layer with weights computes ``y = f(x, w)``; its backward computes ``dx`` (needed by
the layer before, and at the chunk's input by the stage before: on the critical path) and
``dw`` (needed only by the optimizer: it can wait). Zero-bubble schedules (Qi et al. 2024,
"Zero Bubble Pipeline Parallelism") run the two apart::

    forward   x ─► [ln1] ─► [q k v] ─► attention ─► [proj] ─► ... ─► y
    B         dx ◄─ ... ◄─ every dx, keeping dy at the output of every [layer] ◄─ dy
    W         for every [layer]:  its kept dy ─► dw       (a linear layer: dw = dyᵀ x)

B asks autograd for the gradients of the chunk's input *and* of every layer's output, so
it computes the whole chain of input gradients once and no weight gradient; W starts
from each layer's saved output gradient and goes no further than that layer's weights.
Together they do the work of one ordinary backward, no more.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn


@contextmanager
def layer_outputs(chunk: nn.Module):
    """Yield a list that fills, during the block, with ``(layer, output)`` for every call
    of a layer of ``chunk`` that holds weights (a linear layer, a norm, an embedding)."""
    seen: list = []
    layers = [mod for mod in chunk.modules() if next(mod.parameters(recurse=False), None)
              is not None]
    hooks = [mod.register_forward_hook(lambda mod, args, y: seen.append((mod, y)))
             for mod in layers]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def input_gradient(output, grad_output, chunk_input, layers: list) -> tuple:
    """B: the gradient of ``chunk_input`` (None when it needs none: the first stage's
    tokens) and of every layer output in ``layers``; the graph is kept for W."""
    wanted = ([chunk_input] if chunk_input is not None else []) + [y for _, y in layers]
    grads = torch.autograd.grad(output, wanted, grad_output, retain_graph=True)
    if chunk_input is None:
        return None, list(grads)
    return grads[0], list(grads[1:])


def weight_gradients(layers: list, layer_grads: list) -> None:
    """W: each layer's weight gradients from its output gradient, accumulated in ``.grad``.
    One call per layer: a call from several outputs at once would follow each output back
    through the layers before it, and add into their output gradients again."""
    for (layer, y), dy in zip(layers, layer_grads):
        torch.autograd.backward(y, dy, inputs=list(layer.parameters(recurse=False)))
