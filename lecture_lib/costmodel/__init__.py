"""Formulas: memory per device, FLOPs, communication volume and time, step time.

One submodule per kind of cost; everything is re-exported here.
* :mod:`.comm`: the alpha-beta model, ring-collective times, link presets.
* :mod:`.moe`: mixture-of-experts parameters, FLOPs per token, all-to-all bytes.
"""
from .comm import (INFINIBAND_NDR, NVLINK_H100, Link, bus_factor, collective_time,
                   fit_alpha_beta)
from .moe import all_to_all_bytes, mlp_params, moe_flops_per_token, moe_params

__all__ = ["Link", "NVLINK_H100", "INFINIBAND_NDR", "bus_factor", "collective_time",
           "fit_alpha_beta"]
__all__ += ["mlp_params", "moe_params", "moe_flops_per_token", "all_to_all_bytes"]
