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
reused by the next call). Results are bit-identical to the run without the
block: nothing is changed, only timed. Turn it on once per rank and around
the whole program that communicates (all ranks of a group must be emulated).

Not emulated: torch's own ``DistributedDataParallel`` and ``fully_shard``
(FSDP2) and DTensor issue their collectives from C++ or through functional
collectives, which these wrappers do not see: compare them in real time only.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from .. import launch
from . import p2p
from .clock import _ACTIVE, Clock, current
from .comm import COLLECTIVES, ORIGINAL, State, _collective, install, uninstall, wrap
from .compute import ComputeMode
from .presets import Cluster
from .presets import preset as make_preset


@contextmanager
def emulated(spec: str | Cluster = "h100-node", **changes):
    """Run the block in the virtual time of ``spec`` (a preset name or a :class:`Cluster`).

    ``changes`` override the preset's fields (``fp32="tf32"``, ``gpus_per_node=4``).
    Yields this rank's :class:`~.clock.Clock`.
    """
    cluster = make_preset(spec, **changes)
    if current() is not None:
        raise RuntimeError("the emulation is already on in this process")
    clock = Clock(label=cluster.label())
    state = State(clock, cluster)
    wrappers = {name: wrap(state, name, _collective) for name in COLLECTIVES if name in ORIGINAL}
    wrappers.update({name: wrap(state, name, body) for name, body in p2p.BODIES.items()})
    undo = install(wrappers)
    _ACTIVE.append(clock)
    ok = False
    try:
        with ComputeMode(clock, cluster, state):
            yield clock
            with state.quiet():
                clock.resolve()
        ok = True
    finally:
        if not ok:
            clock._pending.clear()       # a failed rank must not wait for its peers' clocks
        uninstall(undo)
        _ACTIVE.remove(clock)


@dataclass
class EmulatedResult:
    """What one rank returned, and its clock (``clock.now()``, ``clock.spans``, ...)."""
    result: object
    clock: Clock


def _rank_main(fn, cluster, args, kwargs):
    with emulated(cluster) as clock:
        result = fn(*args, **kwargs)
    return EmulatedResult(result, clock)


def run(fn, world_size: int, *args, preset: str | Cluster = "h100-node",
        backend: str = "auto", timeout: float | None = None, **kwargs) -> list[EmulatedResult]:
    """``lecture_lib.run(fn, world_size, *args, **kwargs)`` with every rank emulated.

    The preset is checked here, before any process starts. Returns one
    :class:`EmulatedResult` per rank.
    """
    cluster = make_preset(preset)
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    extra = {} if timeout is None else {"timeout": timeout}
    return launch.run(_rank_main, world_size, fn, cluster, args, kwargs, backend=backend,
                      **extra)
