"""Calibrate the step-time model on this machine and compare it with measured steps.

    python examples/calibrate_cost_model.py

The same as notebook 08, section 5, as a script (prints a markdown table).
"""
import numpy as np

from lecture_lib import calibration
from lecture_lib.dims import ParallelDims, Recipe
from lecture_lib.models import GPTConfig

small = GPTConfig()
link = calibration.measure_link(2)
rate, overhead, _ = calibration.measure_compute(small, 16, microbatches=4)
print(f"link alpha {link.alpha*1e6:.0f} us beta {link.beta/1e9:.2f} GB/s; "
      f"rate {rate/1e9:.2f} GFLOP/s; overhead {overhead*1e3:.2f} ms/layer/microbatch")
M4 = Recipe(microbatches=4)             # 4 micro-batches where there is a pipeline
CONFIGS = [(ParallelDims(), Recipe()), (ParallelDims(dp=2), Recipe()),
           (ParallelDims(tp=2), Recipe()), (ParallelDims(pp=2), M4), (ParallelDims(dp=4), Recipe()),
           (ParallelDims(dp=2, tp=2), Recipe()), (ParallelDims(dp=2, pp=2), M4),
           (ParallelDims(tp=2, pp=2), M4), (ParallelDims(pp=4), M4)]
rows = calibration.predict_vs_measured(small, CONFIGS, 16, rate, overhead, link)
pred = np.array([r["predicted"] for r in rows])
meas = np.array([r["measured"] for r in rows])
err = np.abs(pred - meas) / meas
print("| layout | predicted ms | measured ms | error |")
for r, e in zip(rows, err):
    dims, recipe = r["config"]
    print(f"| {dims.label()} {recipe.label()} | {r['predicted']*1e3:.1f} | {r['measured']*1e3:.1f} "
          f"| {e:.0%} |")
print(f"median error {np.median(err):.0%}, max {err.max():.0%}, "
      f"Spearman {calibration.spearman(pred, meas):.2f}")
