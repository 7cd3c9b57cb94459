"""Pipeline schedule explorer: pick a schedule, pp, m and v; see the Gantt chart and the bubble.

Everything drawn is computed by :func:`lecture_lib.pipeline.simulate` from
the schedule :func:`lecture_lib.pipeline.make_schedule` builds (the same
object the executor runs); the closed form beside it is
:func:`lecture_lib.costmodel.pipeline_bubble` (GPipe, Huang et al. 2019;
interleaved, Narayanan et al. 2021). ``pp`` is the number of pipeline stages (the
course's notation; the papers write p).
"""
from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt

from ...costmodel import pipeline_bubble, zb_h1_bubble
from ...pipeline import NAMES, make_schedule, simulate
from ...pipeline.simulate import action_costs
from .. import plots
from . import explorer


def schedule_figure(name: str, pp: int, m: int, v: int = 1, t_forward: float = 1.0,
                    t_backward: float = 2.0, t_weight: float = 0.0, ax=None):
    """Draw the simulated Gantt chart of one schedule; return (figure, simulation)."""
    schedule = make_schedule(name, pp, m, v)
    sim = simulate(schedule, t_forward, t_backward, t_weight)
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * pp))
    else:
        fig = ax.figure
    if name == "zb-h1":
        theory = zb_h1_bubble(pp, m, t_forward, t_backward, t_weight)
    else:
        theory = pipeline_bubble(pp, m, v if name == "interleaved-1f1b" else 1)
    plots.plot_timeline(ax, sim.timeline, unit="s", labels=True, legend_outside=True,
                        title=f"{name}: pp={pp}, m={m}" + (f", v={v}" if v > 1 else "")
                        + f"; simulated bubble {sim.bubble_fraction:.1%} "
                        f"(closed form {theory:.1%}); peak activations "
                        f"{max(sim.peak_activations):g} micro-batches")
    cost = action_costs(schedule, t_forward, t_backward, t_weight)     # per action, as drawn
    units = ", ".join(f"{k} = {cost[k]:g}" for k in "FBW" if k != "W" or schedule.split_backward)
    ax.set_xlabel(f"simulated time (units: {units})")
    return fig, sim


def schedule_explorer(t_forward: float = 1.0, t_backward: float = 2.0, t_weight: float = 1.0):
    """A widget: schedule, stages pp, micro-batches m, chunks v -> Gantt chart and bubble.

    For schedules without a split backward, B costs ``t_backward + t_weight``.
    """
    name = w.Dropdown(options=NAMES, value="1f1b", description="schedule")
    pp = w.IntSlider(value=4, min=1, max=8, description="stages pp")
    m = w.IntSlider(value=8, min=1, max=32, description="micro-b. m")
    v = w.IntSlider(value=2, min=2, max=4, description="chunks v")
    controls = {"name": name, "pp": pp, "m": m, "v": v}

    def render(name, pp, m, v):
        interleaved = name == "interleaved-1f1b"
        fig, sim = schedule_figure(name, pp, m, v if interleaved else 1,
                                   t_forward, t_backward, t_weight)
        return fig, {"simulation": sim}

    name.observe(lambda _: setattr(v, "disabled", name.value != "interleaved-1f1b"), names="value")
    v.disabled = name.value != "interleaved-1f1b"
    return explorer(controls, render, [w.HBox([name, pp]), w.HBox([m, v])])
