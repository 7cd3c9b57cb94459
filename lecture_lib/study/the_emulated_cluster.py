"""Appendix A2 (the emulated cluster): waves and split-K, NCCL's choice, kernels and launches.

* Q2: a matmul's work units on an H100 (``emulate.kernels.matmul_tiles``: 128 x 128 output
  tiles, split along the inner dimension when there are fewer tiles than SMs) and the share
  of SMs its waves keep busy (``busy_share``), for two weight gradients of GPT-2 small on
  8 sequences of 1,024 tokens: the MLP's first layer (768 x 3072) and an attention
  projection (768 x 768).
* Q3 (what if): NCCL's choice for one bucket of torch's default size on 8 and on 2 GPUs of
  the emulated H100 node (``bucket_cap_mb=25``: torch multiplies it by 2**20, so 25 MiB;
  ``lecture_lib.emulate.nccl``: the Simple ring pays a latency per step, ``2 (p-1)`` steps;
  NVLS one fixed latency; both move the same bus bytes).
* The figures of sections 1 and 2 (plotting only): ``plot_matmul_rates``, ``plot_all_reduce``.
* Q4 (what if): a step of tiny kernels on the emulated H100, eager and with CUDA graphs:
  the host spends ``launch_seconds`` per kernel, the GPU ``kernel_seconds`` per kernel and a
  matmul's ``matmul_fill_seconds`` more; the slower side sets the step.
"""
from __future__ import annotations

import math
from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np
import torch

from ..emulate import FABRICS, H100_SXM, nccl
from ..emulate.kernels import busy_share, matmul_tiles
from ..figures import plots
from . import fmt

TOKENS, WIDTH = 8 * 1024, 768                 # GPT-2 small, 8 sequences per rank
NCCL_BUCKET, NCCL_SIZES = 25 * 2**20, (8, 2)  # torch's default bucket_cap_mb=25: MiB
KERNELS, MATMULS = 400, 100                   # Q4's step


def weight_gradient(d_in: int, d_out: int, tokens: int = TOKENS, device=H100_SXM) -> dict:
    """Tiles, split-K pieces, work units, waves and busy share of ``x^T @ dy``: a
    ``d_in x d_out`` output summed over ``tokens``."""
    out = torch.empty(d_in, d_out, device="meta")
    tiles = math.ceil(d_in / 128) * math.ceil(d_out / 128)
    units = matmul_tiles(out, tokens, device.sms)
    return {"tiles": tiles, "pieces": units // tiles, "units": units,
            "waves": math.ceil(units / device.sms), "busy": busy_share(units, device.sms)}


def q2() -> list[str]:
    fc1, proj = weight_gradient(WIDTH, 4 * WIDTH), weight_gradient(WIDTH, WIDTH)
    assert fc1["pieces"] == 1 < proj["pieces"]
    return [f"{fc1['tiles']} tiles", f"{fc1['waves']} waves", f"{fc1['busy']:.0%}",
            f"only {fc1['units'] - (fc1['waves'] - 1) * H100_SXM.sms} tiles",
            f"{proj['tiles']} tiles", f"{proj['pieces']} pieces", f"{proj['units']} units",
            f"{proj['busy']:.0%}"]


def ring_and_nvls(nbytes: float, p: int, fabric=FABRICS["nvlink4"]) -> dict:
    """Emulated seconds of one all-reduce of ``nbytes`` on ``p`` GPUs of one node: NCCL's
    choice, the best ring (LL or Simple: the same fabric without NVLS) and NVLS."""
    ring = nccl.nccl_choice("all_reduce", nbytes, p, replace(fabric, nvls_busbw=0.0,
                                                              nvls_latency=0.0))
    nvls = fabric.nvls_latency + nccl.bus_bytes("all_reduce", nbytes, p) / fabric.nvls_busbw
    return {"choice": nccl.nccl_choice("all_reduce", nbytes, p, fabric), "ring": ring,
            "nvls": nvls}


def q3() -> list[str]:
    fabric = FABRICS["nvlink4"]
    ring_latency = {p: nccl.SIMPLE_BASE + nccl.steps("all_reduce", p) * fabric.step_latency
                    for p in NCCL_SIZES}
    # NVLS's one latency: longer than the Simple ring's whole latency on 2 GPUs, shorter on 8
    assert ring_latency[2] < fabric.nvls_latency < ring_latency[8]
    out = [fmt(NCCL_BUCKET / 1e6, "MB")]                     # 25 MiB in bytes / 1e6
    for p in NCCL_SIZES:
        r = ring_and_nvls(NCCL_BUCKET, p)
        assert r["ring"][0] == "ring/Simple"
        out += [f"{r['choice'][0]} at p = {p}", fmt(r["nvls"] * 1e6, "us"),
                fmt(r["ring"][1] * 1e6, "us")]
    return out


def tiny_step(kernels: int = KERNELS, matmuls: int = MATMULS, device=H100_SXM) -> dict:
    """Seconds of a step of ``kernels`` kernels that do almost nothing: the host's launches,
    the GPU's fixed costs, and the step eager (the slower of the two) and with CUDA graphs."""
    host = kernels * device.launch_seconds
    gpu = kernels * device.kernel_seconds + matmuls * device.matmul_fill_seconds
    return {"host": host, "gpu": gpu, "eager": max(host, gpu), "graphs": gpu}


def q4() -> list[str]:
    r = tiny_step()
    assert r["host"] > r["gpu"]
    return [fmt(r["host"] * 1e3, "ms"), fmt(r["gpu"] * 1e3, "ms"),
            f"{r['eager'] / r['graphs']:.2f}x"]


PARTS = {"all-reduce": "NCCL collectives", "InfiniBand": "NCCL collectives", "GEMM": "matmuls",
         "HBM": "memory copies", "FA2": "attention", "llm.c": "a whole step"}


def part(row: dict) -> str:
    """Which part of the emulation a row of ``published.table()`` measures."""
    return next(name for key, name in PARTS.items() if key in row["anchor"])


def faster_by(row: dict) -> float:
    """How much faster the emulation runs a row's work than published, as a fraction: its rate
    over the published rate, less 1; for a time row (unit ``"s"``), how much shorter its time is
    than the published one. Either way its size is the row's error, so one number has one sign."""
    if row["unit"] == "s":
        return 1 - row["emulated"] / row["published"]
    return row["emulated"] / row["published"] - 1


def plot_checks(table: list[dict], stamp: str):
    """The opening figure: each check (a row not fitted) as :func:`faster_by`, right for the
    emulation faster than published whatever the unit, coloured by the part of the emulation
    it checks, against a check's 15% tolerance."""
    checks = [r for r in table if not r["fitted"]]
    fig, ax = plt.subplots(figsize=(7.5, 0.26 * len(checks) + 1.4))
    y = np.arange(len(checks))[::-1]
    ax.axvspan(-15, 15, color="0.92", label="a check's tolerance, 15%")
    palette = [plots.COLORS[k] for k in ("comm", "compute", "optimizer", "backward", "W")]
    colors = dict(zip(dict.fromkeys(PARTS.values()), palette))
    for name, color in colors.items():
        rows = [(r, yi) for r, yi in zip(checks, y) if part(r) == name]
        if rows:
            ax.plot([100 * faster_by(r) for r, _ in rows], [yi for _, yi in rows], "o", color=color,
                    ls="none", label=name)
    ax.axvline(0, color="0.4", lw=0.8)
    ax.set_yticks(y, [r["anchor"] for r in checks], fontsize=9)
    ax.set_xlim(-25, 25)
    ax.set_xlabel("error (%): emulation slower  <-  0  ->  emulation faster than published")
    ax.set_title(f"the emulated GPUs against {len(checks)} published measurements\n"
                 "the constants were not fitted to", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    plots.stamp(fig, text=stamp)
    return fig


def plot_matmul_rates(charged: dict, rate: float, bandwidth: float, stamp: str):
    """Section 4's figure: each matmul's charged rate against the roofline at the achieved
    ``rate`` and ``bandwidth``; forward and weight gradients in two panels."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    intensity = np.logspace(1.5, 3.2, 200)
    for ax, grad in zip(axes, (False, True)):
        ax.plot(intensity, np.minimum(rate, intensity * bandwidth) / 1e12, "-", color="0.2",
                label="roofline at the achieved rates")
        for model, color, marker in (("small GPT", plots.COLORS["compute"], "o"),
                                     ("GPT-2 small", plots.COLORS["backward"], "s")):
            points = [c for (m, n), c in charged.items()
                      if m == model and n.endswith("grad") == grad]
            ax.plot([c["intensity"] for c in points], [c["rate"] / 1e12 for c in points], marker,
                    ms=8, color=color, ls="none", label=model)
        ax.set_xscale("log")
        ax.set_yscale("log")
        plots.plain_log_ticks(ax.xaxis, *ax.get_xlim())
        ax.set_xlabel("arithmetic intensity F / M (FLOPs per byte)")
        ax.set_title("weight gradients" if grad else "forward", fontsize=10)
    plots.plain_log_ticks(axes[0].yaxis, 10, 1000, outer=True)
    axes[0].set_ylabel("bf16 matmul rate (TFLOP/s)")
    fig.suptitle("bf16 matmuls on an H100: charged rate against the roofline", fontsize=11)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    plots.stamp(fig, text=stamp)
    return fig


def plot_all_reduce(sizes, picked: dict, switch: dict, ideal, beta: float, stamp: str):
    """Section 5's figure: NCCL's pick with and without NVLS (``picked``: per size, the
    (algorithm, seconds) pair; ``switch``: where each first changes algorithm) against the
    roofline's alpha-beta ring (``ideal`` seconds, ``beta`` bytes/s)."""
    fig, ax = plt.subplots(figsize=(8.5, 4))
    us = {k: np.array([s for _, s in v]) * 1e6 for k, v in picked.items()}
    for k, style, color, offset in (("with NVLS", "-o", plots.COLORS["comm"], (-95, 25)),
                                    ("without NVLS", "--s", plots.COLORS["W"], (-110, 45))):
        ax.plot(sizes, us[k], style, ms=4, color=color, mfc=color if k == "with NVLS" else "none",
                label=f"NCCL's pick, {k}")
        _, first_size, _, b = switch[k]
        i = list(sizes).index(first_size)
        ax.annotate(f"{b} from here", (first_size, us[k][i]), xytext=offset,
                    textcoords="offset points", fontsize=8, color=color,
                    arrowprops=dict(arrowstyle="->", color=color))
    ax.text(sizes[1], us["with NVLS"][1] * 0.55, "both: ring/LL below the crossover", fontsize=8,
            color="0.3")
    ax.plot(sizes, np.asarray(ideal) * 1e6, ":", color="0.4", zorder=1,
            label=f"roofline: alpha-beta ring,\nbeta {beta / 1e9:.0f} GB/s (cost model)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plots.plain_log_ticks(ax.yaxis, 5, 2e4, mantissas=(1, 3), outer=True)
    ticks = 2.0 ** np.arange(10, 33, 5)
    ax.set_xticks(ticks, [f"{t / 2**30:g} GiB" if t >= 2**30 else f"{t / 2**20:g} MiB" if t >= 2**20
                         else f"{t / 2**10:g} KiB" for t in ticks])
    ax.set_xlabel("all-reduce size (bytes per rank)")
    ax.set_ylabel("time (us)")
    ax.set_title("one all-reduce on 8 H100s: NCCL's pick against the cost model's ring")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    plots.stamp(fig, text=stamp)
    return fig


ANSWERS = {"Q2": q2, "Q3": q3, "Q4": q4}
