"""The memory notebook's hand calculations: bytes per parameter under ZeRO; 70B on 64 H100s.

* Q2: model-state bytes per rank per parameter, mixed-precision Adam (2 + 2 + 12),
  ``costmodel.model_state_breakdown`` (Rajbhandari et al. 2020, section 3.1).
* Q3: the Llama-style 70B preset (``costmodel.PRESETS``) on 64 H100s as dp 4 x tp 8 x pp 2,
  ZeRO-1, micro-batch 1, its 8192-token sequence, sequence parallelism and selective
  recomputation: memory per device from ``costmodel.memory_per_device`` (activations from
  Korthikanti et al. 2022); bytes each GPU sends per step for the data-parallel gradient
  reduce-scatter and parameter all-gather of its bf16 slice, ``(dp-1)/dp x 2 bytes x Psi /
  (tp pp)`` each (ring collectives, ``costmodel.bus_factor``), and their time over InfiniBand
  NDR (``costmodel.collective_time``; dp groups span nodes when tp fills a node of 8).
  Tensor- and pipeline-parallel traffic is not counted: it depends on the batch.
"""
from __future__ import annotations

from ..costmodel import (
    INFINIBAND_NDR,
    PRESETS,
    bus_factor,
    collective_time,
    memory_per_device,
    model_state_breakdown,
)
from . import fmt

MIXED_ADAM = {"param_bytes": 2, "grad_bytes": 2, "optimizer_bytes_per_param": 12}
MODEL, DP, TP, PP, STAGE = "Llama-style 70B", 4, 8, 2, 1
GPT3_LAYOUT = {"dp": 8, "tp": 8, "pp": 16, "zero_stage": 1}  # notebook 08's (Narayanan et al.)


def q2() -> list[str]:
    return [fmt(model_state_breakdown(1.0, 8, s, **MIXED_ADAM)["total"], "bytes")
            for s in (1, 2, 3)]


def seventy_b() -> dict:
    shape = PRESETS[MODEL]
    mem = memory_per_device(shape, DP, TP, PP, STAGE, microbatch_size=1, recompute="selective",
                            sequence_parallel=True)
    local = shape.num_params / (TP * PP)                 # parameters in one GPU's slice
    gathered = 2 * local                                 # bf16 bytes of that slice
    sent = (bus_factor("reduce_scatter", DP) + bus_factor("all_gather", DP)) * gathered
    seconds = (collective_time("reduce_scatter", gathered, DP, INFINIBAND_NDR)
               + collective_time("all_gather", gathered, DP, INFINIBAND_NDR))
    return {"local_params": local, "memory": mem, "sent": sent, "seconds": seconds}


def q3() -> list[str]:
    r = seventy_b()
    m = r["memory"]
    return [fmt(r["local_params"] / 1e9, "billion parameters"), fmt(m["params"] / 1e9, "GB"),
            fmt(m["optimizer"] / 1e9, "GB"), fmt(m["activations"] / 1e9, "GB"),
            fmt(m["total"] / 1e9, "GB"), fmt(r["sent"] / 1e9, "GB"),
            fmt(INFINIBAND_NDR.beta / 1e9, "GB/s"), fmt(r["seconds"], "s")]


def gpt3_without_sp() -> dict:
    """The calculator's GPT-3 layout per device, with and without sequence parallelism."""
    shape = PRESETS["GPT-3 175B"]
    return {sp: memory_per_device(shape, **GPT3_LAYOUT, microbatch_size=1, recompute="selective",
                                  sequence_parallel=sp)
            for sp in (True, False)}


def q5() -> list[str]:
    m = gpt3_without_sp()
    return [fmt(m[True]["activations"] / 1e9, "GB"), fmt(m[False]["activations"] / 1e9, "GB"),
            fmt(m[True]["total"] / 1e9, "GB"), fmt(m[False]["total"] / 1e9, "GB"),
            fmt(m[False]["activations"] / m[True]["activations"], "times")]


ANSWERS = {"Q2": q2, "Q3": q3, "Q5": q5}
