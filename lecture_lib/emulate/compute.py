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

What emulating costs in real time: the dispatch to Python of every operation
and, per operation, a few microseconds of bookkeeping. What can be done once
is done once: what kind an operation is (free, write-only, its FLOP formula)
once per operation; a FLOP count once per (operation, argument shapes, other
arguments), since torch's formulas read only those (a formula registered
"raw", which may read tensor values, is called every time); the FLOP rate
once per dtype.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, shape_wrapper

_FREE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
         "lift_fresh", "alias", "set_", "resize_", "_local_scalar_dense"}
_COMM_NAMESPACES = {"c10d", "_c10d_functional", "c10d_functional", "_dtensor"}
# In-place operations that overwrite their first argument without reading it.
_WRITE_ONLY = {"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_"}
# Every formula torch registers through ``shape_wrapper`` shares this code object: such a
# formula sees only the shapes of the tensors and the other arguments, so it can be cached.
_SHAPES_ONLY = shape_wrapper(lambda *args, **kwargs: 0).__code__
_TENSOR = torch.Tensor


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes an operation touches reading or writing ``t`` (at most its storage)."""
    nbytes = t.nbytes
    if t.is_contiguous():
        return nbytes
    try:
        return min(nbytes, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):      # tensors without storage
        return nbytes


def _tensors(values, into: list) -> list:
    """Append the tensors among ``values`` and inside the lists/tuples among them (one level)."""
    for v in values:
        if isinstance(v, _TENSOR):
            into.append(v)
        elif isinstance(v, (list, tuple)):
            into.extend(x for x in v if isinstance(x, _TENSOR))
    return into


class OpInfo:
    """What is known of an operation before it runs: free, write-only, its FLOP formula."""
    __slots__ = ("free", "write_only", "counter", "cached", "flops")

    def __init__(self, func):
        packet = func._overloadpacket
        self.free = (func.namespace in _COMM_NAMESPACES or func.is_view
                     or packet.__name__ in _FREE)
        self.write_only = packet.__name__ in _WRITE_ONLY
        self.counter = flop_registry.get(packet)
        self.cached = getattr(self.counter, "__code__", None) is _SHAPES_ONLY
        self.flops: dict = {}           # signature -> FLOPs, for a shapes-only formula

    def count(self, args, kwargs, out) -> float:
        """FLOPs of one call (0 without a formula), cached by signature where it is safe."""
        if self.counter is None:
            return 0.0
        if self.cached:
            try:
                key = (_signature(args), _signature(tuple(kwargs.items())), _signature(out))
                return self.flops[key]
            except KeyError:
                value = self.flops[key] = float(self.counter(*args, **kwargs, out_val=out))
                return value
            except TypeError:           # an unhashable argument: count it every time
                pass
        return float(self.counter(*args, **kwargs, out_val=out))


def _signature(value):
    """A hashable stand-in for an argument as a shapes-only formula sees it."""
    if isinstance(value, _TENSOR):
        return (_TENSOR, tuple(value.shape))
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    return value


_INFO: dict = {}


def _info(func) -> OpInfo:
    """The :class:`OpInfo` of an operation, built once per operation."""
    info = _INFO.get(func)
    if info is None:
        info = _INFO[func] = OpInfo(func)
    return info


def _cost(info: OpInfo, args, kwargs, out, rate, bandwidth: float) -> tuple[float, float, int]:
    """``(seconds, flops, bytes)`` of a non-free operation; ``rate(dtype)`` in FLOP/s."""
    inputs = _tensors(args, [])
    if info.write_only and inputs:
        del inputs[0]                                 # written (an output), not read
    if kwargs:
        _tensors(kwargs.values(), inputs)
    outputs = _tensors(out if isinstance(out, (list, tuple)) else (out,), [])
    nbytes = 0
    for t in inputs:
        nbytes += tensor_bytes(t)
    for t in outputs:
        nbytes += tensor_bytes(t)
    flops = info.count(args, kwargs, out)
    ref = outputs[0] if outputs else (inputs[0] if inputs else None)
    seconds = max(flops / rate(ref.dtype if ref is not None else torch.float32),
                  nbytes / bandwidth)
    return seconds, flops, nbytes


def op_cost(func, args, kwargs, out, cluster) -> tuple[float, float, int]:
    """``(seconds, flops, bytes)`` of one executed operation on ``cluster``'s device."""
    info = _info(func)
    if info.free:
        return 0.0, 0.0, 0
    return _cost(info, args, kwargs or {}, out, cluster.flops, cluster.device.memory_bandwidth)


class ComputeMode(TorchDispatchMode):
    """Charge each operation on ``clock``'s compute stream (while ``state.charging()``)."""

    def __init__(self, clock, cluster, state):
        super().__init__()
        self.clock, self.cluster, self.state = clock, cluster, state
        self._rates: dict = {}
        self._bandwidth = cluster.device.memory_bandwidth

    def _rate(self, dtype) -> float:
        rate = self._rates.get(dtype)
        if rate is None:
            rate = self._rates[dtype] = self.cluster.flops(dtype)
        return rate

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch would otherwise wrap ``__torch_dispatch__`` in ``torch._dynamo``'s
        ``disable``, importing dynamo (seconds of CPU) in every rank on its first operation
        and adding a call per operation. Nothing under the emulation is ``torch.compile``d."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **kwargs) if kwargs else func(*args)
        if self.state.depth == 0:                     # state.charging(), inlined: per op
            info = _INFO.get(func) or _info(func)
            if not info.free:
                seconds, flops, _ = _cost(info, args, kwargs or {}, out, self._rate,
                                          self._bandwidth)
                if seconds > 0:
                    self.clock.charge(seconds, flops)
        return out
