"""Every collective refused to a submission that may use point-to-point messages only
(ex00, ex01: a ring built from send/recv), at each level Python reaches:
``torch.distributed``'s functions, the process group's and its backends' methods, the
``c10d`` operators (DDP, functional collectives) and the rendezvous store. The tests' own
code keeps them. Called once per process, after :func:`.refusal.refuse`."""
from __future__ import annotations

import sys
import warnings

from .refusal import LibraryAnswerRefused, refusal_message, submission_frame

#: c10d operators that move no data between ranks' tensors (point to point, barriers).
_P2P_OPS = {"send", "recv_", "recv_any_source_", "barrier", "monitored_barrier_",
            "check_for_nan", "wait_tensor", "isend", "irecv", "batch_p2p_ops"}
_KINDS = {"allreduce": "all-reduce", "all_reduce": "all-reduce", "allgather": "all-gather",
          "all_gather": "all-gather", "reduce_scatter": "reduce-scatter", "broadcast": "broadcast",
          "alltoall": "all-to-all", "all_to_all": "all-to-all", "gather": "gather",
          "scatter": "scatter", "reduce": "reduce", "all_sum": "all-reduce"}
_STORE_METHODS = ("set", "get", "add", "append", "compare_set", "multi_get", "multi_set",
                  "wait", "check", "delete_key", "num_keys", "list_keys", "queue_push",
                  "queue_pop", "queue_len")
_IN_FORCE: list = []                 # the operator guards (alive while they refuse)


def _collectiverefusal_message(name: str, where) -> LibraryAnswerRefused:
    short = name.rsplit(":", 1)[-1].rsplit(".", 1)[-1].strip("_")
    kind = next((v for k, v in _KINDS.items() if short.startswith(k)), None)
    what = f"the collective {kind} ({name})" if kind else f"the rendezvous store ({name})"
    return LibraryAnswerRefused(refusal_message(
        what, "this exercise allows point-to-point messages only "
        "(dist.send, recv, isend, irecv, batch_isend_irecv), no collective at any level "
        "(torch.distributed, the process group or its backend, c10d operators, DDP, the store)",
        where))


class _OpGuard:
    """A c10d operator's CPU kernel, refused to the submission: the level every collective a
    Python caller reaches goes through (``dist.*``, the process group's methods, DDP's
    reducer, functional collectives, ``torch.ops.c10d``), inference mode or not. Anyone
    else's call runs the original kernel (this override steps aside for the call)."""

    def __init__(self, namespace: str, name: str):
        import torch  # noqa: PLC0415  (only where an exercise refuses collectives)
        self.namespace, self.name = namespace, name
        self.op = getattr(getattr(torch.ops, namespace), name).default
        keys = [k for k in ("CPU", "SparseCPU")
                if self.op.has_kernel_for_dispatch_key(getattr(torch._C.DispatchKey, k))]
        self.keys, self.library = keys or ["CPU"], None
        self._install()

    def _install(self) -> None:
        import torch  # noqa: PLC0415
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.library = torch.library.Library(self.namespace, "IMPL")
            for key in self.keys:
                self.library.impl(self.name, self.kernel, key)

    def kernel(self, *args, **kwargs):
        where = submission_frame(sys._getframe(1))
        if where is not None:
            raise _collectiverefusal_message(f"{self.namespace}::{self.name}", where)
        self.library._destroy()
        try:
            return self.op(*args, **kwargs)
        finally:
            self._install()


def _refuse_method(cls, name: str, immediate: bool = False) -> None:
    original = getattr(cls, name, None)
    if original is None:
        return

    def refusing(self, *args, **kwargs):
        where = submission_frame(sys._getframe(1), immediate)
        if where is not None:
            raise _collectiverefusal_message(f"{cls.__name__}.{name}", where)
        return original(self, *args, **kwargs)
    setattr(cls, name, refusing)


def refuse_collectives() -> None:
    """Refuse every collective to the submission (once per process)."""
    if _IN_FORCE:
        return
    import torch  # noqa: PLC0415
    import torch.distributed  # noqa: F401, PLC0415
    c10d = torch._C._distributed_c10d
    guards = []
    for full in torch._C._dispatch_get_all_op_names():
        namespace, _, name = full.partition("::")
        if namespace in ("c10d", "_c10d_functional", "_c10d_functional_autograd") \
                and name not in _P2P_OPS:
            guards.append(_OpGuard(namespace, name))
    for name in dir(c10d.Backend):                   # a backend's methods skip the operators
        if any(name.strip("_").startswith(k) for k in _KINDS):
            _refuse_method(c10d.Backend, name)
    for name in dir(c10d._StoreCollectives):
        if not name.startswith("_"):
            _refuse_method(c10d._StoreCollectives, name)
    for name in _STORE_METHODS:                      # the store: the submission's own calls
        _refuse_method(c10d.Store, name, immediate=True)
    _IN_FORCE.extend(guards)
