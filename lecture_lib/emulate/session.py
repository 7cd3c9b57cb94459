"""Turning the emulation on: a context manager inside a rank function, or a launcher.

>>> def step(model, batch):                      # a rank function, under lecture_lib.run
...     with emulate.emulated("h100-node") as clock:
...         loss = train_step(model, batch)     # the real code, unchanged
...     return loss, clock.now(), clock.spans    # emulated seconds and timeline
>>> results = emulate.run(train, 4, preset="h100-node")   # or all ranks at once
>>> results[0].result, results[0].clock.now()

Inside the block every ATen operation is charged by :mod:`.compute`, every
``torch.distributed`` collective and message by :mod:`.comm` and :mod:`.p2p`;
on exit the wrapped functions are restored (the launcher's warm workers are
reused by the next call). A module that holds its own reference (``from
torch.distributed import all_reduce``) is patched too when it is code of the
course or of the user, whatever its name (a student's file, a submission under
grading, a script): every module that is neither the standard library nor an
installed package (:func:`user_code`). Results are bit-identical to the run
without the block: nothing is changed, only timed. Turn it on once per rank
and around the whole program that communicates (all ranks of a group must be
emulated, and must wait for their asynchronous collectives at the same places:
see :mod:`.comm`).

The dry run: models of real size without computing them
-------------------------------------------------------
Emulated time depends only on shapes, sizes and the order of operations,
never on values; so it can be read from a program that computes nothing.
``emulated(spec, dry_run=True)`` runs the block on *fake tensors* (torch's
``FakeTensorMode``: a tensor with a shape, a dtype and no data; each
operation only works out its output's shape). The compute mode sits above
the fake mode, so it sees and charges every operation exactly as in a real
run; collectives and messages skip their data and still agree on times with
the other ranks (:mod:`.comm`). A GPT-3 175B layer on 8 tensor-parallel
ranks takes seconds per rank, and reads the emulated time a real run would.

What the program must do: create its model and data *inside* the block (a
tensor made before it is real: it is read as a fake of its shape, but a real
model's gradients cannot be fake), and let no decision depend on a value:
``.item()``, ``if loss > 0``, ``print(x)`` of a fake tensor fail (the dry run
suits programs whose control flow depends on shapes only, as training steps
do). ``model.to(device)`` and ``copy.deepcopy`` of a fake model work (two
torch quirks are worked around below). Return numbers, not tensors:
:func:`run` turns fake tensors in the result into ``meta`` tensors.

Not emulated: torch's own ``DistributedDataParallel`` and ``fully_shard``
(FSDP2) and DTensor issue their collectives from C++ or through functional
collectives, which these wrappers do not see: compare them in real time only.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorConverter,
    FakeTensorMode,
)
from torch.utils._pytree import tree_map_only

from ..runtime import launch
from . import p2p
from .clock import _ACTIVE, Clock, current
from .comm import COLLECTIVES, ORIGINAL, State, _collective
from .compute import ComputeMode
from .presets import Cluster
from .presets import preset as make_preset


def check_dry_run(dry_run) -> bool:
    if not isinstance(dry_run, bool):
        raise TypeError(f"dry_run must be True or False, not {dry_run!r}")
    return dry_run


class FreshFakes(FakeTensorConverter):
    """Fake tensors for an operation's fresh outputs, not remembered: torch 2.13's
    ``Module.to`` swaps a fake parameter for its copy (``swap_tensors``), which refuses a
    tensor a weak reference points to, and the converter's memo keeps one to every fake
    output (pytorch issues 148977, 170781), so ``model.to(device)`` failed by chance. A
    fresh output is never looked up again: forgetting it changes nothing."""

    def from_meta_and_device(self, fake_mode, t, device, pytype=None, dispatch_keys=None):
        return FakeTensor(fake_mode, t, device, pytype=pytype, dispatch_keys=dispatch_keys)


class DryRunFakes(FakeTensorMode):
    """The dry run's fake mode: a tensor made before the block reads as a fake of its shape;
    ``copy.deepcopy`` of a fake tensor keeps it in this mode (torch copied the mode too)."""

    def __init__(self):
        super().__init__(allow_non_fake_inputs=True)
        self.fake_tensor_converter = FreshFakes(copy_data=self.propagate_real_tensors)

    def __deepcopy__(self, memo):
        return self


class DryRunCompute(ComputeMode):
    """The compute mode over fake tensors: an operation that needs a value says so in words."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            raise RuntimeError(
                f"the dry run has no values, and {func} needs one (.item(), a branch on a "
                "tensor, a shape that depends on values): a dry run suits programs whose "
                "control flow depends on shapes only") from e


@contextmanager
def emulated(spec: str | Cluster = "h100-node", *, dry_run: bool = False, **changes):
    """Run the block in the virtual time of ``spec`` (a preset name or a :class:`Cluster`).

    ``changes`` override the preset's fields (``fp32="tf32"``, ``gpus_per_node=4``);
    ``dry_run=True`` runs the block on fake tensors (see above). Yields this
    rank's :class:`~.clock.Clock`.
    """
    check_dry_run(dry_run)
    cluster = make_preset(spec, **changes)
    if current() is not None:
        raise RuntimeError("the emulation is already on in this process")
    clock = Clock(label=cluster.label())
    state = State(clock, cluster, dry_run)
    wrappers = {name: wrap(state, name, _collective) for name in COLLECTIVES if name in ORIGINAL}
    wrappers.update({name: wrap(state, name, body) for name, body in p2p.BODIES.items()})
    undo = install(wrappers)
    _ACTIVE.append(clock)
    ok = False
    try:
        with ExitStack() as modes:
            if dry_run:                  # outside the compute mode: it sees each op first
                modes.enter_context(DryRunFakes())
            modes.enter_context((DryRunCompute if dry_run else ComputeMode)(
                clock, cluster, state))
            yield clock
            with state.quiet():
                clock.resolve()
        ok = True
    finally:
        if not ok:                       # a failed rank must not wait for its peers' clocks
            clock._pending.clear()
            state.clear()
        uninstall(undo)
        _ACTIVE.remove(clock)


# ----------------------------------------------------------------------------
# Installing the wrappers
# ----------------------------------------------------------------------------

def wrap(state: State, name: str, body):
    """The function installed for ``name``: emulated at depth 0, the original inside."""
    original = ORIGINAL[name]

    def wrapper(*args, **kwargs):
        if state.depth > 0:
            return original(*args, **kwargs)
        state.depth += 1
        try:
            return body(state, name, args, kwargs)
        finally:
            state.depth -= 1

    wrapper.__name__ = wrapper.__qualname__ = original.__name__
    wrapper.__doc__ = original.__doc__
    wrapper.__wrapped__ = original
    return wrapper


_STDLIB = tuple({os.path.join(sysconfig.get_paths()[key], "") for key in ("stdlib", "platstdlib")})
_INSTALLED = tuple(f"{os.sep}{folder}{os.sep}" for folder in ("site-packages", "dist-packages"))


def user_code(name: str, module) -> bool:
    """Whether module ``name`` is the course's or the user's own code: ``lecture_lib``, the
    script or notebook (``__main__``), and every module loaded from a file that is neither in
    the standard library nor in an installed package (torch and the rest of site-packages)."""
    if name == "__main__" or name == "lecture_lib" or name.startswith("lecture_lib."):
        return True
    path = getattr(module, "__dict__", {}).get("__file__")    # no module __getattr__ called
    return (isinstance(path, str) and os.path.isabs(path) and not path.startswith(_STDLIB)
            and not any(folder in path for folder in _INSTALLED))


def _homes() -> list:
    """Modules that may hold their own reference to a torch.distributed function."""
    return [m for name, m in list(sys.modules.items()) if m is not None and user_code(name, m)]


def install(wrappers: dict) -> list:
    """Replace the functions in torch.distributed and in the course's and the user's modules
    (:func:`user_code`); return undo."""
    undo = []
    by_id = {id(f): name for name, f in ORIGINAL.items()}
    for module in [dist, c10d] + _homes():
        for attr, value in list(vars(module).items()):
            name = by_id.get(id(value))
            if name is not None and name in wrappers:
                undo.append((module, attr, value))
                setattr(module, attr, wrappers[name])
    return undo


def uninstall(undo: list) -> None:
    for module, attr, value in reversed(undo):
        setattr(module, attr, value)


# ----------------------------------------------------------------------------
# Every rank at once
# ----------------------------------------------------------------------------

@dataclass
class EmulatedResult:
    """What one rank returned, and its clock (``clock.now()``, ``clock.spans``, ...)."""
    result: object
    clock: Clock
    dry_run: bool = False


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _rank_main(fn, cluster, dry_run, args, kwargs):
    with emulated(cluster, dry_run=dry_run) as clock:
        result = fn(*args, **kwargs)
    if dry_run:                          # fake tensors cannot leave the rank: their shapes can
        result = tree_map_only(FakeTensor, _meta, result)
    return EmulatedResult(result, clock, dry_run)


def run(fn, world_size: int, *args, preset: str | Cluster = "h100-node",
        backend: str = "auto", timeout: float | None = None, dry_run: bool = False,
        **kwargs) -> list[EmulatedResult]:
    """``lecture_lib.run(fn, world_size, *args, **kwargs)`` with every rank emulated
    (``dry_run=True``: on fake tensors, see above).

    The preset and ``dry_run`` are checked here, before any process starts.
    Returns one :class:`EmulatedResult` per rank.
    """
    check_dry_run(dry_run)
    cluster = make_preset(preset)
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    extra = {} if timeout is None else {"timeout": timeout}
    return launch.run(_rank_main, world_size, fn, cluster, dry_run, args, kwargs,
                      backend=backend, **extra)
