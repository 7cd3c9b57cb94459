"""The data-parallel notebook's hand calculations: global batch, per-call latency, hiding.

* Q2: the global batch identity ``B = b x m x dp`` (micro-batch, accumulation steps,
  data-parallel degree; Goyal et al. 2017 train with the global batch as the unit;
  PyTorch DDP's ``no_sync`` accumulates micro-batches locally).
* Q3: the latency of ``naive`` DDP, one ring all-reduce per parameter tensor against one
  flat all-reduce: ``2 (p-1) alpha`` each (Thakur et al. 2005; ``costmodel.collective_time``
  with zero bytes).
* Q4: backward hides all but the last bucket when ``t_bwd >= t_comm - t_last`` (Li et al.
  2020, section 3.2.3); with ``t_bwd = t_token x T``, ``T`` tokens per rank, that is
  ``T >= (t_comm - t_last) / t_token``. Backward costs ``4 N`` FLOPs per token (twice the
  forward's ``2 N``; Kaplan et al. 2020), run at ``EFFICIENCY`` of the H100's dense bf16
  peak (``costmodel.H100_BF16_FLOPS``); each bucket's all-reduce costs the ring's
  ``2 (p-1) alpha + 2 (p-1)/p n / beta`` on NVLink (``costmodel.NVLINK_H100``). The
  gradients are cut into full buckets of 25 MiB (torch's ``bucket_cap_mb=25`` counts MiB), the
  last one partial; a real model's buckets close at tensor boundaries, so it has a few more.
* Q5 (what if): the same model accumulating ``m`` micro-batches under ``no_sync``: the
  all-reduces hide behind the last micro-batch's backward alone, so the threshold is
  per micro-batch and does not fall with ``m``; the communication per sample does.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt

from ..costmodel import H100_BF16_FLOPS, NVLINK_H100, collective_time
from ..models import GPT, GPTConfig
from . import fmt

MICRO_BATCH, ACCUMULATION, DP, SEQ_LEN = 4, 16, 64, 2048
PARAMS, GRAD_BYTES, BUCKET_BYTES, GPUS, EFFICIENCY = 1e9, 2, 25 * 2**20, 8, 0.5
WHAT_IF_MICRO_BATCHES = 4


def global_batch(microbatch_size: int, accumulation: int, dp: int) -> int:
    """Sequences per optimizer step: each of dp ranks adds up ``accumulation`` micro-batches."""
    return microbatch_size * accumulation * dp


def hiding_threshold() -> dict:
    """t_comm, t_last, backward seconds per token, and the tokens per rank that hide the rest."""
    total = PARAMS * GRAD_BYTES
    buckets = math.ceil(total / BUCKET_BYTES)
    last = total - (buckets - 1) * BUCKET_BYTES
    t_comm = ((buckets - 1) * collective_time("all_reduce", BUCKET_BYTES, GPUS, NVLINK_H100)
              + collective_time("all_reduce", last, GPUS, NVLINK_H100))
    t_last = collective_time("all_reduce", last, GPUS, NVLINK_H100)
    per_token = 4 * PARAMS / (EFFICIENCY * H100_BF16_FLOPS)
    return {"buckets": buckets, "t_comm": t_comm, "t_last": t_last, "per_token": per_token,
            "tokens": (t_comm - t_last) / per_token}


def q2() -> list[str]:
    sequences = global_batch(MICRO_BATCH, ACCUMULATION, DP)
    return [f"{sequences:,} sequences", f"{sequences * SEQ_LEN / 1e6:.3g} million tokens"]


def q3() -> list[str]:
    tensors = len(list(GPT(GPTConfig()).parameters()))
    one = collective_time("all_reduce", 0, 4, NVLINK_H100)
    return [f"{tensors} tensors", fmt(tensors * one * 1e3, "ms"), fmt(one * 1e6, "us")]


def q4() -> list[str]:
    r = hiding_threshold()
    return [f"{r['buckets']} buckets", fmt(r["t_comm"] * 1e3, "ms"), fmt(r["t_last"] * 1e6, "us"),
            fmt(r["per_token"] * 1e6, "us"), f"{math.ceil(r['tokens']):,} tokens",
            fmt(NVLINK_H100.beta / 1e9, "GB/s")]                  # the ring the answer assumes


def q5() -> list[str]:
    r, m = hiding_threshold(), WHAT_IF_MICRO_BATCHES
    tokens = math.ceil(r["tokens"])
    return [f"{tokens:,} tokens", f"{m * tokens:,} tokens", f"{m} times"]


ANSWERS = {"Q2": q2, "Q3": q3, "Q4": q4, "Q5": q5}


# --- section 4's table and bucket-size figure (formatting only; the notebook asserts) ---

def run_name(r: dict) -> str:
    """A dry-run row's label: its bucket size, or flat / per-parameter."""
    if r["variant"] == "bucketed":
        return f"{r['bucket_size_mb']:g} MiB"
    return {"flat": "flat", "individual": "per-parameter"}[r["variant"]]


def phase_table(real: dict) -> str:
    """The step split into forward, backward, optimizer and exposed time, in ms, one row a run."""
    lines = [f"{'per rank':>10s} {'':>14s} {'calls':>5s} {'fwd':>6s} {'bwd':>6s} {'opt':>6s} "
             f"{'exposed':>8s} {'step':>6s}   (ms)"]
    for seqs, rows in real.items():
        for r in rows:
            lines.append(f"{seqs:4d} seq{'s' if seqs > 1 else ' '}   {run_name(r):>14s} "
                         f"{r['collectives']:5d} "
                         + " ".join(f"{1e3 * r[k]:6.2f}"
                                    for k in ("forward", "backward", "optimizer"))
                         + f" {1e3 * r['exposed']:8.2f} {1e3 * r['step']:6.2f}")
    return "\n".join(lines)


def bucket_sweep_figure(real: dict, best: dict):
    """Each run's step against the best of its batch size, flat to per-parameter."""
    order = [run_name(r) for r in real[1]]               # flat, 100 ... 1 MiB, per-parameter
    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    for seqs, rows in real.items():
        x = [order.index(run_name(r)) for r in rows]
        slower = [100 * (r["step"] / best[seqs]["step"] - 1) for r in rows]
        ax.plot(x, slower, "o-" if seqs == 1 else "s", ms=6,      # 8 sequences: three runs, no line
                label=f"{seqs} sequence{'s' if seqs > 1 else ''} per rank")
        for xi, y, r in zip(x, slower, rows):
            if seqs == 8 and r is best[8] and run_name(r) == run_name(best[1]):
                continue                                      # both best: one "best" label
            both = seqs == 1 and run_name(r) == run_name(best[8])
            text = (("best of both" if both else "best") if r is best[seqs]
                    else f"{y:+.1f}%" if abs(y) < 10 else f"{y:+.0f}%")
            steep = seqs == 1 and 0 < xi and slower[xi - 1] > y + 5   # a line falls into it
            ax.annotate(text, (xi, y), textcoords="offset points", fontsize=8,
                        ha="left" if steep else "center",               # steep: right of the marker
                        xytext=(7, 4) if steep else (0, 8 if seqs == 1 else -8),
                        va="bottom" if seqs == 1 else "top")
    ax.set_xticks(range(len(order)),
                  [f"{n}\n{r['collectives']} call{'s' if r['collectives'] > 1 else ''}"
                   for n, r in zip(order, real[1])], fontsize=8)
    ax.set_ylim(-5, None)
    ax.set_xlabel("bucket size (all-reduces per step)")
    ax.set_ylabel("step slower than the best\nof its batch size (%)")
    ax.set_title("GPT-2 small, DDP on 8 GPUs: the bucket-size sweep")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def flat_all_reduce(flat: dict, cluster) -> tuple[str, float]:
    """The algorithm the emulated NCCL picks for flat's one all-reduce, and its bus bandwidth
    (a ring's bytes per rank, ``2 (p-1)/p n``, over the measured time; nccl-tests' busbw)."""
    algorithm, _ = cluster.collective_choice("all_reduce", flat["grad_bytes"], range(8))
    return algorithm, 2 * 7 / 8 * flat["grad_bytes"] / flat["comm"]

