"""DDP on an emulated H100 node: overlap, the step-time model, and the bucket-size sweep.

Runs the course's own DDP wrappers (one flat all-reduce after backward; one
async all-reduce per parameter; async buckets) on real ranks under
``lecture_lib.emulate``, so every figure is emulated H100 + NVLink time,
measured from the real code on this machine (independent of how busy it is).
For each variant it prints the step split (forward, backward, communication,
the last bucket), the step-time model

    T_step ~= T_fwd + max(T_bwd, T_comm - T_last) + T_last + T_opt

and, for a sweep of bucket sizes, the exposed communication against the
bucket model of CS336 / :mod:`lecture_lib.costmodel.ddp` with the emulated
link's own constants (per call o = 2 (p-1) alpha, bandwidth w = beta p / (2 (p-1))).

    python examples/emulated_ddp.py --world-size 4 --out ddp_emulated.png
"""
from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)

from lecture_lib import emulate  # noqa: E402
from lecture_lib.costmodel.ddp import best_bucket_bytes  # noqa: E402
from lecture_lib.data_parallel.emulated import measure_ddp  # noqa: E402
from lecture_lib.figures import plots  # noqa: E402
from lecture_lib.models import GPTConfig  # noqa: E402

US = 1e6


def model_step(r: dict) -> float:
    """The step-time model above, from the emulated parts of the same step."""
    return (r["forward"] + max(r["backward"], r["comm"] - r["last_bucket"]) + r["last_bucket"]
            + r["optimizer"])


def print_rows(rows: list[dict]) -> None:
    print(f"{'variant':>10} {'bucket MB':>9} {'calls':>5} {'step us':>8} {'fwd':>7} {'bwd':>7} "
          f"{'comm':>7} {'last':>7} {'exposed':>8} {'model us':>8}")
    for r in rows:
        exposed = r["step"] - r["forward"] - r["backward"] - r["optimizer"]
        mb = "-" if r["bucket_size_mb"] is None else f"{r['bucket_size_mb']:g}"
        print(f"{r['variant']:>10} {mb:>9} {r['collectives']:>5} {r['step'] * US:8.1f} "
              f"{r['forward'] * US:7.1f} {r['backward'] * US:7.1f} {r['comm'] * US:7.1f} "
              f"{r['last_bucket'] * US:7.1f} {exposed * US:8.1f} {model_step(r) * US:8.1f}")


def bucket_model(grad_bytes: float, p: int, link) -> tuple[float, float]:
    """``(per-call seconds o, all-reduce bandwidth w)`` of the ring on ``link``."""
    return 2 * (p - 1) * link.alpha, link.beta * p / (2 * (p - 1))


def figure(rows: list[dict], sweep: list[dict], args, path: str) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5))
    lines = {}
    for r in rows:
        mb = r["bucket_size_mb"]
        name = r["variant"] if mb is None else f"bucketed {mb:g} MB"
        lines[f"{name}: compute"] = [s for s in r["spans"] if s[0] != "comm"]
        lines[f"{name}: comm"] = [s for s in r["spans"] if s[0] == "comm"]
    plots.plot_timeline(top, lines, title="one DDP step, rank 0", unit="us", legend_outside=True)
    sizes = [r["bucket_size_mb"] for r in sweep]
    bottom.plot(sizes, [r["step"] * US for r in sweep], "o-", label="emulated step")
    bottom.plot(sizes, [model_step(r) * US for r in sweep], "s--", label="step-time model")
    bottom.set_xscale("log")
    bottom.set_xlabel("bucket size (MB)")
    bottom.set_ylabel("step time (us)")
    bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    plots.stamp(fig, "gloo", args.world_size, emulated=args.preset)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--preset", default="h100-node", choices=sorted(emulate.PRESETS))
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-per-rank", type=int, default=8)
    ap.add_argument("--buckets", default="0.25,1,2,4,8,16", help="bucket sizes in MB")
    ap.add_argument("--out", default="", help="save the figure here (png)")
    args = ap.parse_args()
    cfg = GPTConfig(vocab_size=256, seq_len=args.seq_len, d_model=args.d_model,
                    n_heads=max(1, args.d_model // 64), n_layers=args.layers)
    sizes = [float(s) for s in args.buckets.split(",")]
    configs = ([{"variant": "flat"}, {"variant": "individual"}]
               + [{"variant": "bucketed", "bucket_size_mb": mb} for mb in sizes])
    rows = measure_ddp(configs, args.world_size, cfg, args.batch_per_rank,
                       preset=args.preset, timeout=900)
    print(f"{emulate.label(args.preset)}; {args.world_size} ranks; GPT {rows[0]['params']:,} "
          f"parameters ({rows[0]['grad_bytes'] / 2**20:.1f} MiB of fp32 gradients), "
          f"{rows[0]['tokens_per_rank']} tokens per rank")
    print_rows(rows)
    sweep = rows[2:]
    best = min(sweep, key=lambda r: r["step"])
    link = emulate.preset(args.preset).link(range(args.world_size))
    o, w = bucket_model(rows[0]["grad_bytes"], args.world_size, link)
    print(f"best emulated bucket: {best['bucket_size_mb']:g} MB; bucket model sqrt(s w o) = "
          f"{best_bucket_bytes(rows[0]['grad_bytes'], w, o) / 2**20:.2f} MB "
          f"(o = {o * US:.1f} us, w = {w / 1e9:.0f} GB/s)")
    if args.out:
        figure([rows[0], rows[1], best], sweep, args, args.out)
        print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
