"""Notebook 03b (ZeRO and FSDP): its hand calculations, and its FSDP timeline read and drawn.

* Q2: model-state bytes per rank per parameter, mixed-precision Adam (2 + 2 + 12),
  ``costmodel.model_state_breakdown`` (Rajbhandari et al. 2020, section 3.1).
* Q3: the Llama-style 70B preset (``costmodel.PRESETS``) on 64 H100s as dp 4 x tp 8 x pp 2,
  ZeRO-1, micro-batch 1, its 8192-token sequence, sequence parallelism and selective
  recomputation: memory per device from ``costmodel.memory_per_device`` (activations from
  Korthikanti et al. 2022); bytes each GPU sends per step for the data-parallel gradient
  reduce-scatter and parameter all-gather of its bf16 slice, ``(dp-1)/dp x 2 bytes x Psi /
  (tp pp)`` each (ring collectives, ``costmodel.bus_factor``), and their time over InfiniBand
  NDR (``costmodel.collective_time``; dp groups span nodes when tp fills a node of 8).
  Tensor- and pipeline-parallel traffic is not counted: it depends on the batch.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ..costmodel import (
    INFINIBAND_NDR,
    PRESETS,
    bus_factor,
    collective_time,
    memory_per_device,
    model_state_breakdown,
)
from ..figures import plots
from ..figures.pictures import zero_shards
from . import fmt

MIXED_ADAM = {"param_bytes": 2, "grad_bytes": 2, "optimizer_bytes_per_param": 12}
MODEL, DP, TP, PP, STAGE = "Llama-style 70B", 4, 8, 2, 1


def q2() -> list[str]:
    return [fmt(model_state_breakdown(1.0, 8, s, **MIXED_ADAM)["total"], "bytes")
            for s in (1, 2, 3)]


def seventy_b() -> dict:
    shape = PRESETS[MODEL]
    mem = memory_per_device(shape, DP, TP, PP, STAGE, microbatch_size=1, recompute="selective",
                            sequence_parallel=True)
    local = shape.num_params / (TP * PP)                 # parameters in one GPU's slice
    gathered = 2 * local                                 # bf16 bytes of that slice
    sent = (bus_factor("reduce_scatter", DP) + bus_factor("all_gather", DP)) * gathered
    seconds = (collective_time("reduce_scatter", gathered, DP, INFINIBAND_NDR)
               + collective_time("all_gather", gathered, DP, INFINIBAND_NDR))
    return {"local_params": local, "memory": mem, "sent": sent, "seconds": seconds}


def q3() -> list[str]:
    r = seventy_b()
    m = r["memory"]
    return [fmt(r["local_params"] / 1e9, "billion parameters"), fmt(m["params"] / 1e9, "GB"),
            fmt(m["optimizer"] / 1e9, "GB"), fmt(m["activations"] / 1e9, "GB"),
            fmt(m["total"] / 1e9, "GB"), fmt(r["sent"] / 1e9, "GB"),
            fmt(INFINIBAND_NDR.beta / 1e9, "GB/s"), fmt(r["seconds"], "s")]


ANSWERS = {"Q2": q2, "Q3": q3}


def _span(r: dict, kind: str, unit: str, phase: str) -> tuple[float, float]:
    return next((a, b) for k, u, ph, a, b in r["unit_spans"] if (k, u, ph) == (kind, unit, phase))


def blocked(r: dict) -> dict:
    """Seconds rank 0 waits for each (unit, phase)'s all-gather in one emulated FSDP step."""
    return {(u, ph): b - a for k, u, ph, a, b in r["unit_spans"] if k == "blocked"}


def in_flight_while_computing(r: dict, nxt: str, cur: str, phase: str) -> bool:
    """Whether unit ``nxt``'s all-gather is in flight while unit ``cur`` computes."""
    spans = r["unit_spans"]
    flying = [(a, b) for k, u, ph, a, b in spans if k == "in flight" and u == nxt and ph == phase]
    busy = [(a, b) for k, u, ph, a, b in spans if k == "compute" and u == cur and ph == phase]
    return any(min(b, d) > max(a, c) for a, b in flying for c, d in busy)


def fsdp_timeline(on: dict, off: dict) -> dict:
    """Section 3's FSDP timeline (``zero.emulated.time_at_scale`` cases, prefetch on and off).

    ``parts``: the exposed time split by where the rank waits (blocks, embeddings, head);
    ``worst``: over the blocks after block 0's forward, the largest ratio of the wait with
    prefetch to the wait without; ``blocks_waiting_off``: how many (block, phase) pairs wait
    without prefetch; ``prefetch_overlaps``: whether block 1's forward all-gather flies while
    block 0 computes and block 0's backward one while block 1 computes (prefetch on, off);
    ``tok_emb_unhidden``: the rank waits for all of the token embedding's forward all-gather
    (first in forward) and for at least 95% of its backward re-gather (last in backward, issued
    after the position embedding's brief backward); ``busy_between_head_passes``: in both cases
    the compute stream runs (the loss, in no unit) from the head's forward to its backward call.
    """
    b_on, b_off = blocked(on), blocked(off)
    hidden = [k for k in b_off if k[0].startswith("blocks.") and k != ("blocks.0", "forward")]
    parts = {p: sum(t for (u, _), t in b_on.items() if u.startswith(p))
             for p in ("blocks.", "tok_emb", "pos_emb", "head")}
    return {
        "parts": parts,
        "other": on["exposed"] - sum(parts.values()),
        "worst": max(b_on.get(k, 0.0) / b_off[k] for k in hidden),
        "n_after_first": len(hidden),
        "blocks_waiting_off": sum(u.startswith("blocks.") for u, _ in b_off),
        "prefetch_overlaps": {
            name: (in_flight_while_computing(r, "blocks.1", "blocks.0", "forward")
                   and in_flight_while_computing(r, "blocks.0", "blocks.1", "backward"))
            for name, r in (("on", on), ("off", off))},
        "tok_emb_unhidden": _tok_emb_unhidden(on),
        "busy_between_head_passes": all(_busy_between_head_passes(r) for r in (on, off)),
    }


def outside_units(r: dict) -> dict:
    """Rank 0's stretches in no unit, in seconds since the step's start: ``loss`` (from the
    head's forward to its backward all-gather call: the loss forward and backward),
    ``reduce_scatter`` (from the last unit's compute to the end of the compute stream's last
    wait: the last gradient reduce-scatter) and ``optimizer`` (from there to the step's end)."""
    last = max(b for k, *_, a, b in r["unit_spans"] if k == "compute")
    waits = [b for a, b in r["streams"]["idle"] if b > last]
    opt = max(waits, default=last)
    return {"loss": (_span(r, "compute", "head", "forward")[1],
                     _span(r, "in flight", "head", "backward")[0]),
            "reduce_scatter": (last, opt), "optimizer": (opt, r["step"]),
            "tail_waits_on": sorted({k for k, c, d in r["streams"]["wire"]
                                     for a, b in r["streams"]["idle"]
                                     if b > last and min(b, d) > max(a, c)})}


def _busy_between_head_passes(r: dict) -> bool:
    start = _span(r, "compute", "head", "forward")[1]
    end = _span(r, "in flight", "head", "backward")[0]
    return end > start and any(a <= start and b >= end for a, b in r["streams"]["compute"])


def _tok_emb_unhidden(r: dict) -> bool:
    if _span(r, "blocked", "tok_emb", "forward") != _span(r, "in flight", "tok_emb", "forward"):
        return False
    (a, b), (c, d) = (_span(r, k, "tok_emb", "backward") for k in ("blocked", "in flight"))
    return b == d and b - a >= 0.95 * (d - c)


_SPAN_STATES = {"in flight": "in flight", "compute": "computing"}  # zero_shards.STATE_COLORS keys
OUTSIDE_LABEL = "outside any unit: loss, last collectives, optimizer"
SPAN_LABELS = {"in flight": "all-gather in flight",
               "compute": "unit computing",
               "blocked": "rank blocked on the all-gather"}


def draw_fsdp_timeline(at: dict, titles: dict, cases=("fsdp", "fsdp_no_prefetch"), stamp: str = "",
                       title: str = ""):
    """Draw rank 0's FSDP timeline, one panel per case of ``zero.emulated.time_at_scale``.

    Each row is a unit (embeddings, blocks, head), forward down the rows and backward back up;
    bars show a unit's all-gather from its call to the unit's first kernel, the unit computing
    and, below them, narrower and outlined, the rank blocked on the all-gather; the panels share
    one time axis, so the shorter step ends sooner; grey bands, one legend
    entry, mark the stretches in no unit (:func:`outside_units`). ``titles`` names each case;
    the panel title adds the step, the exposed time and its part in the blocks; ``title``, if
    given, heads the figure. Returns the figure.
    """
    colors = {k: zero_shards.STATE_COLORS[v] for k, v in _SPAN_STATES.items()}
    colors["blocked"] = "#FF8C00"
    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 6.6), sharex=True)
    longest = max(at[case]["step"] for case in cases)
    for ax, case in zip(axes, cases):
        r = at[case]
        spans = r["unit_spans"]
        rows = list(dict.fromkeys(u for _, u, *_ in spans))
        for kind, unit, _phase, a, b in spans:
            y, height = rows.index(unit), (0.32 if kind == "blocked" else 0.5)
            ax.barh(y + (0.29 if kind == "blocked" else -0.12), (b - a) * 1e3, left=a * 1e3,
                    height=height, color=colors[kind], label=SPAN_LABELS[kind],
                    edgecolor="#B34700" if kind == "blocked" else "none", lw=1.6)
        ax.axvline(r["step"] * 1e3, color="0.3", ls=":", lw=1, label="end of the step")
        out = outside_units(r)
        for name in ("loss", "optimizer"):
            a = out["reduce_scatter"][0] if name == "optimizer" else out[name][0]
            ax.axvspan(a * 1e3, out[name][1] * 1e3, color="0.9", zorder=0, lw=0,
                       label=OUTSIDE_LABEL)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlim(0, 1.02 * longest * 1e3)                     # one time axis for every panel
        ax.invert_yaxis()
        in_blocks = sum(b - a for k, u, *_, a, b in spans
                        if k == "blocked" and u.startswith("blocks."))
        ax.set_title(f"{titles[case]}: step {r['step'] * 1e3:.1f} ms; rank blocked "
                     f"{r['exposed'] * 1e3:.1f} ms, {in_blocks * 1e3:.1f} ms of it in the blocks",
                     fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    for last in (OUTSIDE_LABEL, "end of the step"):                        # last in the legend
        unique[last] = unique.pop(last)
    axes[-1].set_xlabel("emulated time since the step's start (ms)")
    axes[0].legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                   fontsize=8, handlelength=1.5)
    if title:
        fig.suptitle(title, fontsize=11)
    if stamp:
        plots.stamp(fig, text=stamp)
    fig.tight_layout()
    return fig
