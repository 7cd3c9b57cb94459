"""Compute in virtual time: every operation runs for real and is charged on a roofline.

:class:`ComputeMode` is a ``TorchDispatchMode``: it sees every ATen operation
the rank executes (forward, backward and optimizer, after autograd has done
its part), calls it unchanged (so results are bit-identical), and charges the
rank's compute stream

    seconds = max(FLOPs / rate(dtype), (bytes read + bytes written) / memory bandwidth)

the roofline of Williams, Waterman & Patterson (2009). FLOPs come from
``torch.utils.flop_counter``'s own registry (the formulas ``FlopCounterMode``
uses: 2 m n k for a matmul, convolutions, attention), looked up for the
operation that actually ran; an operation the registry does not know (an
element-wise op, a norm, a softmax, a copy) counts zero FLOPs and is charged
by its bytes alone, so it is not free. Unlike ``FlopCounterMode`` we never
decompose an operation: decomposing could change the numbers it computes.

Bytes are the tensors an operation reads (its tensor arguments) and writes
(its tensor results), each at most its storage's size (an expanded tensor
reads its storage once); ``copy_``, ``fill_``, ``zero_`` and the in-place
random fills write their first argument without reading it. Views
(``view``, ``t``, slicing, ``expand``), fresh allocations (``empty``) and
``detach`` move no data and cost nothing; communication operations
(namespace ``c10d``) are charged by :mod:`.comm`, not here.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

_FREE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
         "lift_fresh", "alias", "set_", "resize_", "_local_scalar_dense"}
_COMM_NAMESPACES = {"c10d", "_c10d_functional", "c10d_functional", "_dtensor"}
# In-place operations that overwrite their first argument without reading it.
_WRITE_ONLY = {"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_"}


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes an operation touches reading or writing ``t`` (at most its storage)."""
    nbytes = t.numel() * t.element_size()
    if t.is_contiguous():
        return nbytes
    try:
        return min(nbytes, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):      # tensors without storage
        return nbytes


def _tensors(values):
    """The tensors among ``values`` and inside the lists/tuples among them (one level)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor):
                    yield x


_INFO: dict = {}


def _info(func):
    """``(free, write-only first argument, flop counter or None)`` of an operation,
    looked up once per operation."""
    info = _INFO.get(func)
    if info is None:
        packet = func._overloadpacket
        free = (func.namespace in _COMM_NAMESPACES or func.is_view
                or packet.__name__ in _FREE)
        info = _INFO[func] = (free, packet.__name__ in _WRITE_ONLY, flop_registry.get(packet))
    return info


def op_cost(func, args, kwargs, out, cluster) -> tuple[float, float, int]:
    """``(seconds, flops, bytes)`` of one executed operation on ``cluster``'s device."""
    free, write_only, counter = _info(func)
    if free:
        return 0.0, 0.0, 0
    inputs = list(_tensors(args))
    if write_only and inputs:
        inputs = inputs[1:]                           # written (an output), not read
    if kwargs:
        inputs += _tensors(kwargs.values())
    outputs = list(_tensors(out if isinstance(out, (list, tuple)) else (out,)))
    nbytes = sum(tensor_bytes(t) for t in inputs) + sum(tensor_bytes(t) for t in outputs)
    flops = float(counter(*args, **kwargs, out_val=out)) if counter is not None else 0.0
    ref = outputs[0] if outputs else (inputs[0] if inputs else None)
    rate = cluster.flops(ref.dtype if ref is not None else torch.float32)
    seconds = max(flops / rate, nbytes / cluster.device.memory_bandwidth)
    return seconds, flops, nbytes


class ComputeMode(TorchDispatchMode):
    """Charge each operation on ``clock``'s compute stream (while ``state.active()``)."""

    def __init__(self, clock, cluster, state):
        super().__init__()
        self.clock, self.cluster, self.state = clock, cluster, state

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch would otherwise wrap ``__torch_dispatch__`` in ``torch._dynamo``'s
        ``disable``, importing dynamo (seconds of CPU) in every rank on its first operation
        and adding a call per operation. Nothing under the emulation is ``torch.compile``d."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.state.charging():
            seconds, flops, _ = op_cost(func, args, kwargs, out, self.cluster)
            if seconds > 0:
                self.clock.charge(seconds, flops)
        return out
