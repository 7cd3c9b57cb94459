"""Pipeline parallelism: the bubble and the activation memory, in closed form.

With ``p`` stages, ``m`` micro-batches and uniform per-stage costs, GPipe and
1F1B idle for ``p - 1`` forward+backward slots out of ``m + p - 1``
(Huang et al. 2019, "GPipe"; Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters using Megatron-LM",
section 2.2.1):

    bubble = (p - 1) / (m + p - 1)

Interleaving ``v`` model chunks per rank shrinks each slot of the ramp by ``v``
(Narayanan et al. 2021, section 2.2.2):

    bubble = (p - 1) / (v m + p - 1)

ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 2.1) fills
part of the ramp with weight-gradient work W; its bubble is
``(p - 1)(t_F + t_B - t_W)`` per rank against ``m (t_F + t_B + t_W)`` of work.

Unequal stages (stage ``i`` costs ``t_i``, forward + backward of one
micro-batch): the first micro-batch crosses every stage (``sum t_i``), then the
slowest stage delivers one every ``max t_i``, so (GPipe and 1F1B, no message
time)

    step = (m - 1) max t_i + sum t_i,    bubble = 1 - m sum t_i / (p step)

(the makespan of ``m`` identical jobs in a flow shop). It is exact for GPipe
when every stage has the same forward:backward ratio, and for 1F1B when the
slowest stage is the last (the one that holds the head, as in a language
model); with equal stages it is the formula above. Balancing stages is why
Llama 3 removes a layer from the first and the last stage (Dubey et al. 2024,
section 3.3.2).

Activations held at once (micro-batches, rank r counted from 0): GPipe all
``m``; 1F1B at most ``min(m, p - r)`` (Narayanan et al. 2021, section 2.2.1).
"""
from __future__ import annotations


def _check(p: int, m: int, v: int = 1) -> None:
    for name, x in (("p", p), ("m", m), ("v", v)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {x!r}")


def pipeline_bubble(p: int, m: int, v: int = 1) -> float:
    """Idle share of a step for GPipe/1F1B (v = 1) and interleaved 1F1B (v chunks)."""
    _check(p, m, v)
    return (p - 1) / (v * m + p - 1)


def zb_h1_bubble(p: int, m: int, t_forward: float, t_backward: float, t_weight: float) -> float:
    """Idle share of a step for ZB-H1 (B = input gradient, W = weight gradient)."""
    _check(p, m)
    idle = (p - 1) * max(t_forward + t_backward - t_weight, 0.0)
    return idle / (m * (t_forward + t_backward + t_weight) + idle)


def _stage_times(stage_times) -> list[float]:
    times = list(stage_times)
    if not times or any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0
                        for t in times) or max(times) <= 0:
        raise ValueError(f"stage_times must be numbers >= 0 (seconds per stage and "
                         f"micro-batch), at least one > 0, not {stage_times!r}")
    return [float(t) for t in times]


def pipeline_step_time(stage_times, m: int) -> float:
    """Step time of GPipe/1F1B with stage ``i`` costing ``stage_times[i]`` (forward +
    backward of one micro-batch): ``(m - 1) max t_i + sum t_i``."""
    times = _stage_times(stage_times)
    _check(len(times), m)
    return (m - 1) * max(times) + sum(times)


def pipeline_bubble_unequal(stage_times, m: int) -> float:
    """Idle share of that step: ``1 - m sum t_i / (p step)``; (p-1)/(m+p-1) when equal."""
    times = _stage_times(stage_times)
    return 1 - m * sum(times) / (len(times) * pipeline_step_time(times, m))


def microbatches_for_bubble(p: int, bubble: float, v: int = 1) -> int:
    """The fewest micro-batches that keep the bubble at or below ``bubble``."""
    _check(p, 1, v)
    if not 0 < bubble < 1:
        raise ValueError(f"bubble must be between 0 and 1, not {bubble!r}")
    m = 1
    while pipeline_bubble(p, m, v) > bubble:
        m += 1
    return m


def peak_microbatches(schedule: str, p: int, m: int, rank: int) -> int:
    """Micro-batches whose activations ``rank`` holds at its peak (GPipe or 1F1B)."""
    _check(p, m)
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(m, p - rank)
    raise ValueError(f"closed form known for 'gpipe' and '1f1b', not {schedule!r}")
