"""Print the FSDP figures of issue 14: bytes sent (Psi), memory, losses and step time vs FSDP2.

    python examples/fsdp_report.py [--world 2] [--steps 8]

Every figure is measured in this run (real time on this machine for the step times).
"""
import argparse

import numpy as np
import torch

import lecture_lib
from lecture_lib.models import GPT, GPTConfig, MarkovText, train_reference
from lecture_lib.zero import experiments as zerox
from lecture_lib.zero import fsdp_experiments as fsdpx

CFG = GPTConfig(n_layers=2)
DATA = MarkovText()


def make_gpt():
    return GPT(CFG)


def batches(step):
    return DATA.batch(step, 8)


def _all(steps):
    return {"volume": fsdpx.measure_comm_volume(make_gpt, batches),
            "memory": fsdpx.measure_fsdp_memory(make_gpt, batches),
            "side": {str(d): zerox.fsdp2_side_by_side(make_gpt, batches, steps, compute_dtype=d)
                     for d in (None, torch.bfloat16)}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    out = lecture_lib.run(_all, args.world, args.steps, timeout=600)
    vol = out[0]["volume"]
    print(f"world {args.world}, Psi = {vol['Psi']} bytes (fp32 parameters)")
    for case in fsdpx.VOLUME_CASES:
        print(f"  {case:10s} sent {vol[case]['sent']:10.0f} B = {vol[case]['psi']:.4f} Psi")
    for reshard, m in out[0]["memory"].items():
        print(f"  reshard_after_forward={reshard}: peak gathered {m['peak_gathered_bytes']} B, "
              f"{m['gathers']} all-gathers, sent {m['sent']:.0f} B")
    ref = train_reference(make_gpt(), batches, args.steps)
    for dtype, side in out[0]["side"].items():
        ours, theirs = side["ours"], side["fsdp2"]
        print(f"  compute {dtype}: held ours {ours['held']} vs FSDP2 {theirs['held']}")
        for name, r in (("ours", ours), ("FSDP2", theirs)):
            diff = max(abs(a - b) / b for a, b in zip(r["result"].losses, ref.losses))
            print(f"    {name:5s} losses {[round(v, 5) for v in r['result'].losses]} "
                  f"(max rel. diff to one-process fp32: {diff:.2e})")
        t_ours = np.mean([np.median(r["side"][dtype]["ours"]["step_seconds"][2:]) for r in out])
        t_fsdp = np.mean([np.median(r["side"][dtype]["fsdp2"]["step_seconds"][2:]) for r in out])
        print(f"    step time (real, median of steps 3..): ours {t_ours * 1e3:.1f} ms, "
              f"FSDP2 {t_fsdp * 1e3:.1f} ms, ratio {t_ours / t_fsdp:.2f}")


if __name__ == "__main__":
    main()
