"""Calibration: the closed-form cost model held against what runs.

A cost model (:mod:`lecture_lib.costmodel`) is formulas and constants. Two
checks of it live here, each a module:

* :mod:`.machine`: the model's constants fitted on this machine (its FLOP rate,
  the fixed cost per layer and micro-batch, the link's alpha and beta), then
  its predicted step times set beside measured ones (real time, notebook 08);
* :mod:`.model_vs_emulation`: the model given an emulation preset's constants
  and set beside the emulated step of the same training (virtual time). Neither
  side calls the other, so where they agree that is evidence.

``from lecture_lib.calibration import measure_link, predict_vs_emulated`` and
``lecture_lib.calibration.X`` find every public name of both modules.
"""
from .machine import (
    ComputeFit,
    fit_compute,
    machine_cluster,
    measure_compute,
    measure_link,
    predict,
    predict_on,
    predict_vs_measured,
    shape_of,
    spearman,
)
from .model_vs_emulation import (
    EMULATED_GPT,
    EMULATED_PRESET,
    check_configs,
    emulated_step,
    model_cluster,
    predict_vs_emulated,
)

__all__ = ["ComputeFit", "fit_compute", "machine_cluster", "measure_compute", "measure_link",
           "predict", "predict_on", "predict_vs_measured", "shape_of", "spearman",
           "EMULATED_GPT", "EMULATED_PRESET", "check_configs", "emulated_step", "model_cluster",
           "predict_vs_emulated"]
