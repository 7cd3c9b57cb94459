"""Formulas: memory per device, FLOPs, communication volume and time, step time.

One submodule per kind of cost; the names below are re-exported here.
* :mod:`.comm`: the alpha-beta model, ring-collective times, link presets.
* :mod:`.moe`: mixture-of-experts parameters, FLOPs per token, all-to-all bytes.
"""
from .comm import (INFINIBAND_HDR, INFINIBAND_NDR, NVLINK_A100, NVLINK_H100, Link, bus_factor,
                   collective_time, fit_alpha_beta)
from .moe import all_to_all_bytes, mlp_params, moe_flops_per_token, moe_params
