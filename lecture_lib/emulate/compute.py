"""Compute in virtual time: every operation runs for real and is charged what a GPU kernel costs.

:class:`ComputeMode` is a ``TorchDispatchMode``: it sees every ATen operation
the rank executes (forward, backward and optimizer, after autograd has done
its part), calls it unchanged (so results are bit-identical), and charges the
rank's compute stream one kernel, as :mod:`.kernels` prices it: a matmul at
the rate measured GEMMs reach with the waves of its tiles, attention at its
flash kernel's measured rate, anything else by its bytes.

* FLOPs come from ``torch.utils.flop_counter``'s registry (2 m n k for a
  matmul), looked up for the operation that ran; attention has one formula
  for every ``scaled_dot_product_attention`` kernel the host dispatches to
  (flash, memory-efficient, cuDNN, or the CPU's flash kernel, which torch's
  registry does not know): torch's SDPA formulas, halved when causal. An
  operation without a formula (element-wise, norms, softmax, copies) is
  charged by its bytes alone.
* Bytes are the tensors an operation reads (its tensor arguments) and writes
  (its tensor results), each at most its storage's size (an expanded tensor
  reads its storage once); ``copy_``, ``fill_``, ``zero_`` and the in-place
  random fills write their first argument without reading it. Views, fresh
  allocations (``empty``) and ``detach`` move no data and cost nothing;
  communication operations (namespace ``c10d``) are charged by :mod:`.comm`.
* The host: in eager mode it spends ``launch`` seconds per operation, and the
  stream cannot start a kernel before the host has launched it, so a small
  model is *launch-bound* (the GPU waits for Python), as real small models
  are. ``launch="graphs"`` (CUDA graphs) removes the host cost. A ``.item()``
  outside the optimizer waits for the GPU (the host catches up).
* The GPU's code path where the CPU's differs: on CPU torch's optimizers loop
  over parameters (about ten small operations each); on a GPU they run
  ``foreach`` kernels (one per operation over all parameters, torch's default
  on CUDA) or one ``fused`` kernel. With ``optimizer="foreach"`` or ``"fused"``
  the operations of an ``optimizer.step()`` are gathered and charged as those
  kernels: the same bytes, the GPU's number of kernels.
* Mixed precision: with ``fp32="bf16"`` ("as if mixed precision") an fp32
  tensor outside the optimizer is charged the bytes of a bf16 one, as a
  mixed-precision run's activations and matmul operands are; the optimizer's
  master weights and states keep their fp32 bytes.

What emulating costs in real time: the dispatch to Python of every operation
and a few microseconds of bookkeeping per operation; what kind an operation
is, once per operation; a FLOP count once per (operation, argument shapes).
"""
from __future__ import annotations

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, shape_wrapper

from .kernels import Charges, attention_shape, matmul_tiles

_FREE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
         "lift_fresh", "alias", "set_", "resize_", "_local_scalar_dense", "_unsafe_view",
         "_reshape_alias"}
_COMM_NAMESPACES = {"c10d", "_c10d_functional", "c10d_functional", "_dtensor"}
# record_function markers and prim's metadata queries (``prim::device``): no kernel
_FREE_NAMESPACES = _COMM_NAMESPACES | {"profiler", "prim"}
# In-place operations that overwrite their first argument without reading it.
_WRITE_ONLY = {"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_"}
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "_scaled_mm"}
# Every formula torch registers through ``shape_wrapper`` shares this code object: such a
# formula sees only the shapes of the tensors and the other arguments, so it can be cached.
_SHAPES_ONLY = shape_wrapper(lambda *args, **kwargs: 0).__code__
_TENSOR = torch.Tensor


KINDS = ("matmuls", "attention", "optimizer step", "element-wise and copies")


def seconds_by_kind(seconds_by_op: dict) -> dict:
    """A clock's ``seconds_by_op`` summed in four kinds (:data:`KINDS`): the matmuls, the
    attention kernels, the optimizer step, and every other kernel (layer norms, activations,
    residual adds, copies: the work a GPU does at its memory bandwidth)."""
    out = dict.fromkeys(KINDS, 0.0)
    for op, seconds in seconds_by_op.items():
        if op == "optimizer step":
            kind = "optimizer step"
        elif op in _MATMULS:
            kind = "matmuls"
        elif op.startswith("_scaled_dot_product") and "attention" in op:
            kind = "attention"
        else:
            kind = "element-wise and copies"
        out[kind] += seconds
    return out


class ComputeMode(TorchDispatchMode):
    """Charge each operation on ``clock``'s compute stream (while ``state.charging()``)."""

    def __init__(self, clock, cluster, state):
        super().__init__()
        self.clock, self.state = clock, state
        self.charges = Charges(cluster)
        self._step = None               # inside optimizer.step(): what it ran, to fuse
        self._hooks: list = []

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch would otherwise wrap ``__torch_dispatch__`` in ``torch._dynamo``'s
        ``disable``, importing dynamo (seconds of CPU) in every rank on its first operation
        and adding a call per operation. Nothing under the emulation is ``torch.compile``d."""
        return False

    def __enter__(self):
        self._hooks = [register_optimizer_step_pre_hook(self._step_begins),
                       register_optimizer_step_post_hook(self._step_ends)]
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        return super().__exit__(*exc)

    def _step_begins(self, optimizer, args, kwargs):
        if self.charges.optimizer != "as-run" and self.state.depth == 0:
            self._step = {"seconds": 0.0, "flops": 0.0, "ops": set()}

    def _step_ends(self, optimizer, args, kwargs):
        """Charge the step as the GPU runs it: one foreach kernel per operation it ran (over
        all parameters), or one fused kernel; the bytes and FLOPs of all of them."""
        step, self._step = self._step, None
        if not step or not step["ops"]:
            return
        kernels = 1 if self.charges.optimizer == "fused" else len(step["ops"])
        c = self.charges
        for _ in range(kernels):        # each kernel a share of the bytes and FLOPs
            self.clock.launch(c.kernel + step["seconds"] / kernels, c.launch,
                              step["flops"] / kernels, "optimizer step")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **kwargs) if kwargs else func(*args)
        if self.state.depth == 0:                     # state.charging(), inlined: per op
            info = _INFO.get(func) or _info(func)
            step = self._step
            if not info.free:
                c = self.charges
                seconds, flops, _ = kernel_cost(c, func, info, args, kwargs or {}, out,
                                                c.half and step is None)
                if step is not None:
                    step["seconds"] += seconds
                    step["flops"] += flops
                    step["ops"].add(info.name)
                else:
                    self.clock.launch(c.kernel + seconds, c.launch, flops, info.name)
            elif step is None and info.name == "_local_scalar_dense":
                self.clock.catch_up()                 # .item(): the host waits for the GPU
        return out


def op_cost(func, args, kwargs, out, cluster) -> tuple[float, float, float]:
    """``(seconds, flops, bytes)`` one executed operation is charged on ``cluster``'s device
    (as one kernel outside an optimizer step)."""
    info = _info(func)
    if info.free:
        return 0.0, 0.0, 0
    charges = Charges(cluster)
    seconds, flops, nbytes = kernel_cost(charges, func, info, args, kwargs or {}, out,
                                         charges.half)
    return charges.kernel + seconds, flops, nbytes


def kernel_cost(c: Charges, func, info: OpInfo, args, kwargs, out,
                mixed: bool) -> tuple[float, float, float]:
    """``(seconds, flops, bytes)`` of one non-free operation as one kernel on ``c``'s
    cluster, without the fixed cost every kernel pays (``c.kernel``)."""
    inputs = _tensors(args, [])
    if info.write_only and inputs:
        del inputs[0]                                 # written (an output), not read
    if kwargs:
        _tensors(kwargs.values(), inputs)
    outputs = _tensors(out if isinstance(out, (list, tuple)) else (out,), [])
    read, written = _nbytes(inputs, mixed), _nbytes(outputs, mixed)
    ref = outputs[0] if outputs else (inputs[0] if inputs else None)
    dtype = ref.dtype if ref is not None else torch.float32
    if info.attention:
        flops, shape = attention_shape(func, args, kwargs)
        return c.attention(flops, read + written, shape, dtype), flops, read + written
    flops = info.count(args, kwargs, out)
    if info.matmul and outputs and flops:
        a = args[1] if info.name in ("addmm", "baddbmm", "addbmm") else args[0]
        tiles = matmul_tiles(outputs[0], a.shape[-1], c.sms) if c.sms else 0
        return c.matmul(flops, read + written, tiles, dtype), flops, read + written
    seconds = (read + written) / c.bandwidth
    if flops:
        seconds = max(seconds, flops / (c.peak(dtype) * c.efficiency))
    return seconds, flops, read + written


class OpInfo:
    """What is known of an operation before it runs: free, write-only, its FLOP formula."""
    __slots__ = ("name", "free", "write_only", "counter", "cached", "flops", "attention",
                 "matmul")

    def __init__(self, func):
        packet = func._overloadpacket
        self.name = packet.__name__
        self.free = (func.namespace in _FREE_NAMESPACES or func.is_view
                     or self.name in _FREE)
        self.write_only = self.name in _WRITE_ONLY
        self.attention = self.name.startswith("_scaled_dot_product") and "attention" in self.name
        self.matmul = self.name in _MATMULS
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


def _nbytes(tensors, mixed: bool) -> float:
    """Bytes of ``tensors``, an fp32 one at bf16's when ``mixed`` (as if mixed precision)."""
    total = 0
    for t in tensors:
        n = tensor_bytes(t)
        total += n // 2 if mixed and t.dtype == torch.float32 else n
    return total
