"""Formulas: memory per device, FLOPs, communication volume and time, step time.

One submodule per kind of cost; everything is re-exported here.
* :mod:`.comm`: the alpha-beta model, ring-collective times, link presets.
"""
from .comm import (INFINIBAND_NDR, NVLINK_H100, Link, bus_factor, collective_time,
                   fit_alpha_beta)
from .ddp import best_bucket_bytes, ddp_overhead, fit_ddp_overhead  # noqa: F401

__all__ = ["Link", "NVLINK_H100", "INFINIBAND_NDR", "bus_factor", "collective_time",
           "fit_alpha_beta"]
