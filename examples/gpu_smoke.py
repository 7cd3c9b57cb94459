"""Smoke test of the GPU paths: every scheme once, on one rank per GPU, under NCCL.

    python examples/gpu_smoke.py            # on a machine with GPUs (NCCL, cuda:<rank>)
    python examples/gpu_smoke.py --cpu      # the same checks on gloo, for the script itself

CI has no GPU, so the NCCL paths are proven only by running this where one is
lent. Each check runs the library's own entry points with ``world_size`` equal
to the number of GPUs (NCCL needs one GPU per rank), compares with one-process
training on the CPU where the scheme trains, and prints PASS or FAIL with the
reason; the exit code is the number of failures.
"""
from __future__ import annotations

import sys
import traceback

import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib import models, pipeline, profiling
from lecture_lib.bandwidth import bandwidth_sweep
from lecture_lib.collectives import ring_all_reduce
from lecture_lib.context_parallel.experiments import compare_attention
from lecture_lib.dims import ParallelDims, Recipe
from lecture_lib.expert_parallel import MoELayer
from lecture_lib.hybrid import merge_ranks, train_on_rank
from lecture_lib.pipeline import experiments as ppx
from lecture_lib.runtime import launch
from lecture_lib.tensor_parallel import experiments as tpx
from lecture_lib.zero.experiments import train_fsdp, train_sharded

CFG = models.GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=4, n_layers=4)


def _reference(steps, batch, optimizer="sgd", lr=0.1):
    data = models.MarkovText(CFG.vocab_size, CFG.seq_len)
    return models.train_reference(models.GPT(CFG, 0), lambda s: data.batch(s, batch), steps, lr,
                                  optimizer)


def check_devices(world, backend):
    def where():
        t = torch.ones(1, device=lecture_lib.device())
        dist.all_reduce(t)
        return str(t.device), dist.get_backend(), t.item()
    out = launch.run(where, world, backend=backend, timeout=120)
    want = "cuda" if backend == "nccl" else "cpu"
    assert all(d.startswith(want) and v == world for d, _, v in out), out
    return out


def check_collectives(world, backend):
    def ring():
        t = torch.arange(10.0, device=lecture_lib.device()) * (dist.get_rank() + 1)
        ring_all_reduce(t)
        rows = bandwidth_sweep([2 ** 12, 2 ** 20], ("all_reduce",), ("torch", "ring"), 1, 3)
        return t.cpu(), rows
    t, rows = launch.run(ring, world, backend=backend, timeout=120)[0]
    assert torch.allclose(t, torch.arange(10.0) * sum(range(1, world + 1)))
    return [(r["impl"], r["bytes"], round(r["busbw"] / 1e9, 2)) for r in rows]


def check_hybrid(world, backend):
    par, recipe = ParallelDims(dp=world), Recipe(microbatches=2, zero_stage=int(world > 1))
    out = launch.run(train_on_rank, world, CFG, par, recipe, 8, 3, 0.1, 0, 0, "sgd",
                     backend=backend, timeout=300)
    models.assert_same_training(merge_ranks(out, par), _reference(3, 8), rtol=1e-4, atol=1e-5)
    return "equal to one process (SGD, rtol 1e-4)"


def check_tensor_parallel(world, backend):
    out = launch.run(tpx.train_on_rank, world, CFG, 3, 8, 0, 0, 0.1, "sgd", backend=backend,
                     timeout=300)
    models.assert_same_training(out[0], _reference(3, 8), rtol=1e-4, atol=1e-5)
    return "equal to one process"


def check_pipeline(world, backend):
    sched = pipeline.make_schedule("1f1b", world, 4)
    out = launch.run(ppx.train_stage, world, sched, CFG, 8, 2, backend=backend,
                     timeout=300)
    loss = [r["losses"] for r in out if r["losses"]][0]
    return f"losses {loss}"


def check_zero(world, backend):
    data = models.MarkovText(CFG.vocab_size, CFG.seq_len)

    def rank_fn():
        return train_sharded(models.GPT(CFG, 0), 1, lambda s: data.batch(s, 8), 2)["result"]
    res = launch.run(rank_fn, world, backend=backend, timeout=300)[0]
    return f"losses {res.losses}"


def check_fsdp(world, backend):
    """FSDP with bf16 compute (casts before the all-gather, fp32 master shards)."""
    data = models.MarkovText(CFG.vocab_size, CFG.seq_len)

    def rank_fn():
        out = train_fsdp(lambda: models.GPT(CFG, 0), lambda s: data.batch(s, 8), 3, lr=0.1,
                         optimizer="sgd", compute_dtype=torch.bfloat16)
        return out["result"]
    res = launch.run(rank_fn, world, backend=backend, timeout=300)[0]
    ref = _reference(3, 8)
    gap = max(abs(a - b) / b for a, b in zip(res.losses, ref.losses))
    assert gap < 2e-2, (res.losses, ref.losses)
    return f"bf16 losses within {gap:.1e} of fp32 one-process"


def check_context_parallel(world, backend):
    if world < 2:
        return "skipped (needs 2 ranks)"
    if backend != launch.choose_backend(world):
        return "skipped (compare_attention picks the backend itself)"
    report = compare_attention(world)
    bad = [r for r in report if not r["close"]]
    assert not bad, bad
    return f"{len(report)} ring/Ulysses cases equal to one process"


def check_expert_parallel(world, backend):
    def moe():
        layer = MoELayer(32, 64, num_experts=2 * world, k=2).to(lecture_lib.device())
        x = torch.randn(64, 32, device=lecture_lib.device(), requires_grad=True)
        y = layer(x)
        y.sum().backward()
        return tuple(y.shape), x.grad is not None
    shape, grad = launch.run(moe, world, backend=backend, timeout=300)[0]
    assert grad
    return f"output {shape}"


def check_profiling(world, backend):
    if backend != launch.choose_backend(world):
        return "skipped (profile_run picks the backend itself)"
    profiles = profiling.profile_run(profiling.data_parallel_step, world, batch_size=4,
                                     sync="flat", active=2)
    return [round(p.comm_share, 3) for p in profiles]


def main(argv) -> int:
    cpu = "--cpu" in argv
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not cpu and gpus == 0:
        print("no GPU here: run with --cpu to exercise the script on gloo")
        return 1
    world, backend = (2, "gloo") if cpu else (gpus, "nccl")
    print(f"{world} ranks on {backend}; torch {torch.__version__}; "
          f"{torch.cuda.get_device_name(0) if gpus else 'no GPU'}")
    failures = 0
    for name, check in [("devices", check_devices), ("collectives", check_collectives),
                        ("hybrid", check_hybrid), ("tensor parallel", check_tensor_parallel),
                        ("pipeline", check_pipeline), ("ZeRO-1", check_zero),
                        ("FSDP bf16", check_fsdp), ("context parallel", check_context_parallel),
                        ("expert parallel", check_expert_parallel),
                        ("profiling", check_profiling)]:
        try:
            print(f"PASS {name}: {check(world, backend)}", flush=True)
        except Exception:
            failures += 1
            print(f"FAIL {name}:\n{traceback.format_exc()[-3000:]}", flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
