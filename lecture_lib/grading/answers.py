"""What each exercise asks for, and the library's functions and classes that are its answer.

:data:`ANSWERS` names them per exercise; in the sandboxed child and on its ranks
they refuse the submission (:mod:`.refusal`), so a submission that calls them
scores nothing on the tests it would pass that way. Inside the sandbox (and on its
ranks) :func:`submission` imports the student's file, those calls refused first, and
the tests see the module through :class:`Submission`, which marks every call
into it as the submission's (also where a name of the module *is* a library
function: ``ring_sum = collectives.ring_all_reduce``).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import cloudpickle

from . import collective_refusal, refusal


@dataclass(frozen=True)
class Answer:
    """What an exercise asks for, and the library's functions and classes (``"module:name"``;
    a class stands for all its methods) that are its answer, refused to the submission.
    ``send_recv_only``: every collective is refused too."""
    what: str
    calls: tuple = ()
    send_recv_only: bool = False


_RING = tuple(f"lecture_lib.collectives:{n}" for n in (
    "ring_all_reduce", "ring_reduce_scatter", "ring_all_gather", "naive_all_reduce",
    "all_to_all", "_reduce_scatter_chunks", "_all_gather_chunks"))
_DDP = tuple(f"lecture_lib.data_parallel.ddp:{n}" for n in (
    "_DataParallel", "DDPNaive", "DDPFlat", "DDPIndividualParameters", "DDPBucketed",
    "_TorchDDP", "make_buckets", "wrap")) + (
    "lecture_lib.comm:all_reduce_flat", "lecture_lib.debugging.planted:sync_gradients",
    "lecture_lib.debugging.planted:planted_ddp",
    "torch.nn.parallel.distributed:DistributedDataParallel")
_CP = tuple(f"lecture_lib.context_parallel.ring:{n}" for n in (
    "ring_shift", "RingAttention", "RingFunction", "ring_attention"))

#: Per exercise: what it asks the student to write, and the calls that are that answer.
ANSWERS: dict[str, Answer] = {
    "ex00": Answer("a sum over the ranks from send/recv", _RING, send_recv_only=True),
    "ex01": Answer("the ring all-reduce from send/recv", _RING, send_recv_only=True),
    "ex02": Answer("bucketed, overlapped data parallelism", _DDP),
    "ex03": Answer("ZeRO-1's sharded optimizer", (
        "lecture_lib.zero.sharded_optimizer:ShardedOptimizer",
        "lecture_lib.zero.sharded_optimizer:ShardedGradientOptimizer",
        "torch.distributed.optim.zero_redundancy_optimizer:ZeroRedundancyOptimizer")),
    "ex04": Answer("the bytes a device holds", tuple(f"lecture_lib.costmodel.memory:{n}" for n in (
        "memory_per_device", "model_state_breakdown", "model_state_bytes",
        "activation_bytes_per_layer", "min_devices_for_states", "TransformerShape")) + (
        "lecture_lib.costmodel.context_parallel:memory_per_device_cp",
        "lecture_lib.costmodel.context_parallel:cp_activation_bytes_per_layer")),
    "ex05": Answer("Megatron's f and g and the column- and row-parallel layers", tuple(
        f"lecture_lib.tensor_parallel.comm:{n}" for n in (
            "CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion",
            "copy_to_tensor_parallel", "reduce_from_tensor_parallel")) + tuple(
        f"lecture_lib.tensor_parallel.layers:{n}" for n in (
            "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
            "ParallelSelfAttention")) + (
        "lecture_lib.tensor_parallel.model:ParallelBlock",
        "lecture_lib.tensor_parallel.model:TensorParallelGPT",
        "torch.distributed.tensor.parallel.style:ColwiseParallel",
        "torch.distributed.tensor.parallel.style:RowwiseParallel",
        "torch.distributed.tensor.parallel.api:parallelize_module")),
    "ex06": Answer("the interleaved 1F1B schedule, which make_schedule('interleaved-1f1b') "
                   "builds", (
        "lecture_lib.pipeline.schedules:interleaved_one_f_one_b",
        "torch.distributed.pipelining.schedules:ScheduleInterleaved1F1B",
        "torch.distributed.pipelining.schedules:_get_1f1b_rank_ops")),
    "ex07": Answer("the pipeline's batched send and receive", (
        "lecture_lib.pipeline.execute:exchange", "lecture_lib.context_parallel.ring:ring_shift")),
    "ex08": Answer("MoE dispatch and combine", (
        "lecture_lib.expert_parallel.dispatch:exchange_counts",
        "lecture_lib.expert_parallel.dispatch:plan_dispatch",
        "lecture_lib.expert_parallel.layer:MoELayer")),
    "ex09": Answer("the rank grid's coordinates and groups", (
        "lecture_lib.mesh:grid_coordinates", "lecture_lib.mesh:grid_groups",
        "lecture_lib.mesh:RankGrid", "torch.distributed.device_mesh:init_device_mesh",
        "torch.distributed.device_mesh:DeviceMesh")),
    "ex10": Answer("the gradient consistency check", (
        "lecture_lib.debugging.consistency:check_gradient_consistency",
        "lecture_lib.debugging.consistency:assert_consistent")),
    "ex11": Answer("a correct data-parallel step", _DDP),
    "ex12": Answer("the FSDP unit's gather, free and reduce-scatter", (
        "lecture_lib.zero.fsdp:FullyShardedModel", "lecture_lib.zero.fsdp_api:get_fsdp",
        "lecture_lib.zero.fsdp_api:fsdp_on_after_backward",
        "lecture_lib.zero.fsdp_api:fsdp_gather_full_params",
        "torch.distributed.fsdp._fully_shard._fully_shard:fully_shard")),
    "ex13": Answer("the online-softmax merge and the ring's step", (
        "lecture_lib.context_parallel.attention:merge",
        "lecture_lib.context_parallel.ulysses:ulysses_attention",
        "lecture_lib.context_parallel.ulysses:UlyssesAttention") + _CP),
    "ex14": Answer("the ring all-reduce's alpha-beta cost and the two-stream step", (
        "lecture_lib.costmodel.ddp:two_stream_step", "lecture_lib.costmodel.comm:collective_time",
        "lecture_lib.emulate.comm:collective_seconds")),
}


class Submission:
    """The student's module inside the sandbox, as the tests see it: calling any of its
    functions or classes (``ex.ring_sum(x)``, ``ex.BucketedDDP(model, 1)``) is a call into the
    submission, also where that name is a library function the module merely imported."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str, module):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", module)

    def __getattr__(self, attr: str):
        value = getattr(self._module, attr)
        return _entry(value, attr) if callable(value) else value

    def __setattr__(self, attr: str, value) -> None:      # a test's probe in the module
        setattr(self._module, attr, getattr(value, "__lecture_entry__", value))

    def __delattr__(self, attr: str) -> None:
        delattr(self._module, attr)

    def __dir__(self):
        return dir(self._module)

    def __reduce__(self):                 # to a rank: the submission's module there
        return (submission, (self._name,))

    def __repr__(self):
        return f"<exercise {self._name}: the submission's module>"


def submission(ex: str) -> Submission:
    """The student's module for exercise ``ex`` in the sandboxed child and on its ranks (the
    file the sandbox copied, ``$LECTURE_SANDBOX_FILE``), seen through :class:`Submission`."""
    return Submission(ex, _import(ex, Path(os.environ["LECTURE_SANDBOX_FILE"])))


def _import(ex: str, path: Path):
    """Import the student's module (in the sandboxed child and on its ranks only)."""
    name = f"exercise_{ex}"
    if name in sys.modules:
        return sys.modules[name]
    answer = ANSWERS.get(ex)
    if answer is not None:                  # before the submission's first line runs
        refusal.refuse(ex, path, name, f"it is the library's answer to this exercise "
                      f"({answer.what})", answer.calls)
        if answer.send_recv_only:
            collective_refusal.refuse_collectives()
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    cloudpickle.register_pickle_by_value(module)      # ranks get it by value
    return module


class _EnteredClass:
    """A class of the submission: constructing it, or calling what it holds, is the
    submission's call; ``isinstance`` and ``issubclass`` see the class."""

    def __init__(self, cls: type, attr: str):
        self._cls, self._attr = cls, attr
        self.__lecture_entry__ = cls            # what the module holds

    def __call__(self, *args, **kwargs):
        with refusal.entered(self._attr):
            return self._cls(*args, **kwargs)

    def __getattr__(self, name: str):
        value = getattr(self._cls, name)
        return _entry(value, f"{self._attr}.{name}") if callable(value) else value

    def __instancecheck__(self, obj) -> bool:
        return isinstance(obj, self._cls)

    def __subclasscheck__(self, cls) -> bool:
        return issubclass(cls, self._cls)

    def __repr__(self):
        return repr(self._cls)


def _entry(value, attr: str):
    if isinstance(value, type):
        return _EnteredClass(value, attr)

    @functools.wraps(value)
    def call(*args, **kwargs):
        with refusal.entered(attr):
            return value(*args, **kwargs)
    call.__lecture_entry__ = value              # what the module holds (a probe restores it)
    return call

