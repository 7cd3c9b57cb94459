"""The closed-form cost model against the emulation: predicted vs emulated 3-D step time.

The cost model (:mod:`lecture_lib.costmodel.steptime`) predicts a step of
``dp x tp x pp`` training from formulas alone: FLOPs over a rate, bytes over
a bandwidth, alpha-beta collectives, the 1F1B bubble; it runs no code. The
emulation (:mod:`lecture_lib.emulate`) runs the real training of
:mod:`lecture_lib.hybrid` and charges each operation as it happens. This
module is the referee: it gives both the *same constants* (the preset's FLOP
rate, memory bandwidth and links become a :class:`costmodel.Cluster
<lecture_lib.costmodel.steptime.Cluster>`), asks each separately, and sets the
answers side by side. Neither calls the other, so where they agree that is
evidence for the model's formulas, and where they differ the difference names
what the formulas leave out (Narayanan et al. 2021 model a step the same way;
the roofline is Williams, Waterman & Patterson 2009).

The same comparison runs at real size in the dry run (``dry_run=True``: fake tensors,
nothing computed), where the steps are long enough for the formulas' idealisations to hold.

The run: the small GPT made wide enough that its matrix multiplies are
compute-bound on the emulated device, as a real run's are. In fp32 (what the
course computes in, charged at the H100's 67 TFLOP/s fp32 rate, ``fp32="fp32"``)
the ridge of the roofline is 67 / 3.35 = 20 FLOPs per byte; a multiply of
``M`` tokens by an ``h x h`` weight does about ``2 M h^2`` FLOPs on
``4 (2 M h + h^2)`` bytes, over 30 FLOPs per byte for the smallest
micro-batch here (128 tokens, ``h`` = 256). The element-wise work between the
multiplies stays memory-bound, as on a real GPU, and the model counts it
(:mod:`lecture_lib.costmodel.traffic`). SGD keeps the optimizer's traffic to
what its formula says (3 values per parameter). One step per configuration
(:func:`lecture_lib.hybrid.emulated_steps`, timed from its start on every rank to its
end on every rank): virtual time needs no warm-up, and with SGD (no optimizer state to
create) the first step is charged what the second is, to within 1% (checked in
``tests/test_calibration.py``).
"""
from __future__ import annotations

import math

import torch

from ..costmodel.steptime import Cluster as ModelCluster
from ..costmodel.traffic import check_optimizer
from ..dims import ParallelDims, Recipe
from ..emulate import Cluster, preset
from ..hybrid import check_hybrid, emulated_steps, job_step
from ..models import GPTConfig
from ..progress import progress
from ..runtime import launch
from .machine import predict_on

EMULATED_GPT = GPTConfig(vocab_size=64, seq_len=64, d_model=256, n_heads=4, n_layers=4)
EMULATED_PRESET = preset("h100-node", fp32="fp32", charges="roofline")


def model_cluster(spec: str | Cluster = EMULATED_PRESET, ranks: int = 1) -> ModelCluster:
    """The cost model's cluster built from an emulation preset's constants: the rate an
    fp32 operation is charged at, the memory bandwidth, the links and the node size; all
    of the peak (the emulation's roofline charges: every operation at the device's full rate)."""
    c = preset(spec)
    nodes = max(1, math.ceil(ranks / c.gpus_per_node))
    return ModelCluster(f"{c.label()} (the emulation's constants)", nodes, c.gpus_per_node,
                        c.flops(torch.float32), float("inf"), c.intra, c.inter,
                        efficiency=1.0, memory_bandwidth=c.device.memory_bandwidth)


def check_configs(cfg: GPTConfig, configs, batch_size: int,
                  steps: int) -> list[tuple[ParallelDims, Recipe]]:
    """Every ``(layout, recipe)`` checked before a process starts; a clear error otherwise."""
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"cfg must be a GPTConfig, not {type(cfg).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, not {steps!r}")
    configs = list(configs)
    if not configs:
        raise ValueError("no configuration to compare")
    for config in configs:
        if not (isinstance(config, tuple) and len(config) == 2
                and isinstance(config[0], ParallelDims) and isinstance(config[1], Recipe)):
            raise TypeError(f"a configuration is a (ParallelDims, Recipe), not {config!r}")
        check_hybrid(cfg, *config, batch_size)
    return configs


def emulated_step(cfg: GPTConfig, dims: ParallelDims, recipe: Recipe, batch_size: int,
                  spec: str | Cluster = EMULATED_PRESET, steps: int = 1,
                  optimizer: str = "sgd", timeout: float = 300.0,
                  dry_run: bool = False) -> dict:
    """Train under the emulation (:func:`~lecture_lib.hybrid.emulated_steps`); the emulated
    seconds of the last step (:func:`~lecture_lib.hybrid.job_step`) and what the rank that
    finished last spent them on (``phases``: compute, comm, idle)."""
    results = launch.run(emulated_steps, dims.world_size, cfg, dims, recipe, batch_size, steps,
                         preset(spec), dry_run, optimizer, timeout=timeout)
    slowest = max(results, key=lambda r: r["ends"][-1])
    return {"seconds": job_step(results), "phases": slowest["last"]["totals"]}


ONE_RANK = ((ParallelDims(), Recipe()),)


def predict_vs_emulated(cfg: GPTConfig = EMULATED_GPT, configs=ONE_RANK, batch_size: int = 16,
                        spec: str | Cluster = EMULATED_PRESET, steps: int = 1,
                        optimizer: str = "sgd", timeout: float = 300.0,
                        dry_run: bool = False) -> list[dict]:
    """For each ``(layout, recipe)``: the cost model's seconds per step on the preset's
    constants and the emulated seconds of the same training (``dry_run``: on fake tensors,
    for a model of real size), their relative error ``(predicted - emulated) / emulated``,
    the model's parts and the emulated phases."""
    configs = check_configs(cfg, configs, batch_size, steps)
    check_optimizer(optimizer)
    spec = preset(spec)
    rows = []
    for dims, recipe in progress(configs, "predicted vs emulated: train each layout"):
        cluster = model_cluster(spec, dims.world_size)
        predicted = predict_on(cfg, dims, recipe, batch_size, cluster, optimizer)
        charged = emulated_step(cfg, dims, recipe, batch_size, spec, steps, optimizer, timeout,
                                dry_run)
        rows.append({"config": (dims, recipe), "predicted": predicted.total,
                     "emulated": charged["seconds"],
                     "error": predicted.total / charged["seconds"] - 1,
                     "parts": predicted.parts(), "phases": charged["phases"]})
    return rows
