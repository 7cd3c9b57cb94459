"""Emulated accelerators: the real code, timed as a chosen GPU cluster would run it.

On a laptop the ranks share a few CPU cores, so real timings show how this
machine behaves, not how GPUs do. The emulation runs the same real code on
the same real processes and tensors, and keeps, per rank, a virtual compute
stream and communication stream (:mod:`.clock`). Each operation is charged
what the chosen device would take (:mod:`.compute`, :mod:`.kernels`): one kernel
at the rates real kernels achieve (matmuls by shape, attention at FlashAttention-2's
measured rates), with its fixed cost and the host's launch, the optimizer as the GPU's
foreach or fused kernels; the devices and their fitted constants are in :mod:`.devices`.
Each message by NCCL's algorithm and protocol for its size (:mod:`.nccl`, :mod:`.comm`,
:mod:`.p2p`). Every constant is sourced, and checked against published GPU
measurements (:mod:`.published`, :mod:`lecture_lib.calibration.published`);
``charges="roofline"`` keeps the idealised model (datasheet peaks, alpha-beta
rings). ``dry_run=True`` runs the program on fake tensors, to time models of
real size without computing them. Virtual time depends only
on what the program does, so it is the same on a busy and an idle machine;
results are bit-identical with and without it. The presets and how to define
a device or a link are in :mod:`.presets`; turning it on in :mod:`.session`.
Importing this package registers :func:`current` as the clock source of
:mod:`lecture_lib.metrics` (:func:`~lecture_lib.metrics.set_clock_source`), so
the library's timers read emulated time while the emulation is on. The
experiments that use it live with what they study (e.g.
:mod:`lecture_lib.data_parallel.emulated`, :mod:`lecture_lib.calibration.model_vs_emulation`).

>>> with emulate.emulated("h100-node") as clock:   # inside a rank function
...     loss = step()
>>> clock.now()                                     # emulated seconds
"""
from ..metrics import set_clock_source as _set_clock_source
from .clock import Clock, current
from .comm import EmulatedWork, collective_seconds, p2p_seconds
from .compute import ComputeMode, op_cost, seconds_by_kind
from .nccl import Fabric
from .presets import A100_SXM, FABRICS, H100_SXM, PRESETS, Cluster, Device, check_link, preset
from .session import EmulatedResult, emulated, run

__all__ = ["Clock", "current", "EmulatedWork", "collective_seconds", "p2p_seconds",
           "ComputeMode", "op_cost", "seconds_by_kind",
           "Fabric", "FABRICS", "A100_SXM", "H100_SXM", "PRESETS",
           "Cluster", "Device",
           "check_link", "preset", "EmulatedResult", "emulated", "run", "label"]

_set_clock_source(current)               # the library's timers read the active clock


def label(spec) -> str:
    """E.g. 'emulated H100 + NVLink': what a figure of emulated time says it shows."""
    return f"emulated {preset(spec).label()}"
