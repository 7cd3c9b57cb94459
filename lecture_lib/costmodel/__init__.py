"""Formulas: memory per device, FLOPs, communication volume and time, step time.

One submodule per kind of cost; everything is re-exported here.
* :mod:`.comm`: the alpha-beta model, ring-collective times, link presets.
* :mod:`.pipeline`: the pipeline bubble and activation memory, in closed form.
"""
from .comm import (INFINIBAND_NDR, NVLINK_H100, Link, bus_factor, collective_time,
                   fit_alpha_beta)
from .pipeline import (microbatches_for_bubble, peak_microbatches, pipeline_bubble,
                       zb_h1_bubble)

__all__ = ["Link", "NVLINK_H100", "INFINIBAND_NDR", "bus_factor", "collective_time",
           "fit_alpha_beta"]
