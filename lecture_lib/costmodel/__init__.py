"""Formulas: memory per device, FLOPs, communication volume and time, step time.

One submodule per kind of cost; everything is re-exported here.
* :mod:`.comm`: the alpha-beta model, ring-collective times, link presets.
* :mod:`.tensor_parallel`: bytes per block under tensor parallelism; a layer's modelled step.
"""
from .comm import (INFINIBAND_NDR, NVLINK_H100, Link, bus_factor, collective_time,
                   fit_alpha_beta)
from .tensor_parallel import (H100_BF16_FLOPS, sent_bytes, tp_block_comm, tp_layer_flops,
                              tp_layer_time)

__all__ = ["Link", "NVLINK_H100", "INFINIBAND_NDR", "bus_factor", "collective_time",
           "fit_alpha_beta"]
__all__ += ["H100_BF16_FLOPS", "sent_bytes", "tp_block_comm", "tp_layer_flops", "tp_layer_time"]
