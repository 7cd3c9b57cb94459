"""Emulated accelerators: the real code, timed as a chosen GPU cluster would run it.

On a laptop the ranks share a few CPU cores, so real timings show how this
machine behaves, not how GPUs do. The emulation runs the same real code on
the same real processes and tensors, and keeps, per rank, a virtual compute
stream and communication stream (:mod:`.clock`). Each operation is charged
what the chosen device would take: compute from the FLOPs torch counts on the
operations executed, on a roofline with memory bandwidth (:mod:`.compute`);
messages from their real sizes through alpha-beta costs on NVLink or
InfiniBand by topology (:mod:`.comm`, :mod:`.p2p`). Virtual time depends only
on what the program does, so it is the same on a busy and an idle machine;
results are bit-identical with and without it. The presets and how to define
a device or a link are in :mod:`.presets`; turning it on in :mod:`.session`.

>>> with emulate.emulated("h100-node") as clock:   # inside a rank function
...     loss = step()
>>> clock.now()                                     # emulated seconds
"""
from .clock import Clock, current
from .comm import EmulatedWork, collective_seconds, p2p_seconds
from .compute import ComputeMode, op_cost
from .presets import A100_SXM, H100_SXM, PRESETS, Cluster, Device, check_link, preset
from .session import EmulatedResult, emulated, run

__all__ = ["Clock", "current", "EmulatedWork", "collective_seconds", "p2p_seconds",
           "ComputeMode", "op_cost", "A100_SXM", "H100_SXM", "PRESETS", "Cluster", "Device",
           "check_link", "preset", "EmulatedResult", "emulated", "run", "label"]


def label(spec) -> str:
    """E.g. 'emulated H100 + NVLink': what a figure of emulated time says it shows."""
    return f"emulated {preset(spec).label()}"
