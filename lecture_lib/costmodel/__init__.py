"""Formulas: memory per device, FLOPs, communication volume and time, step time.

One submodule per kind of cost; everything is re-exported here.
* :mod:`.comm`: the alpha-beta model, ring-collective times, link presets.
* :mod:`.memory`: model states under ZeRO, activations (Korthikanti et al.), per device.
"""
from .comm import (INFINIBAND_NDR, NVLINK_H100, Link, bus_factor, collective_time,
                   fit_alpha_beta)
from .ddp import best_bucket_bytes, ddp_overhead, fit_ddp_overhead  # noqa: F401

__all__ = ["Link", "NVLINK_H100", "INFINIBAND_NDR", "bus_factor", "collective_time",
           "fit_alpha_beta"]
from .memory import (PRESETS, TransformerShape, activation_bytes_per_layer, check_zero_stage,
                     memory_per_device, min_devices_for_states, model_state_breakdown,
                     model_state_bytes)

__all__ += ["model_state_bytes", "model_state_breakdown", "activation_bytes_per_layer",
            "memory_per_device", "min_devices_for_states", "TransformerShape", "PRESETS",
            "check_zero_stage"]
