"""The command line of ``examples/train_gpt2.py``: the same trainer from a shell.

Under ``torchrun`` (``WORLD_SIZE`` is set) every process parses the same
arguments, checks them before it joins the process group, and runs
:func:`.train.train_on_rank` through :func:`.elastic.torchrun_main`: the group's keys live
under torchrun's restart generation (so a restart after ``--fail-at`` never reads a dead
worker's address, PyTorch issue 135712), and a rank whose join, step, checkpoint or final
barrier takes longer than ``--timeout`` seconds ends with a message saying what it waited for
(NCCL and ``cuda:<LOCAL_RANK>`` when there is a GPU per process, gloo otherwise).
Run with plain ``python``, it starts the ranks itself through ``lecture_lib.run``.

    torchrun --standalone --nproc-per-node=2 examples/train_gpt2.py --strategy fsdp
    torchrun --standalone --nproc-per-node=4 examples/train_gpt2.py --strategy 3d --tp 2 --pp 2
    python examples/train_gpt2.py --strategy tp --tp 2 --steps 50

Without ``--tokens`` the corpus, tokenizer and token files of
:mod:`lecture_lib.capstone.tokens` are built (or found in their cache) first.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..dims import ParallelDims
from ..models import GPTConfig
from .elastic import DEFAULT_TIMEOUT, check_failure, torchrun_main
from .strategies import STRATEGIES
from .train import TrainConfig, check_config, cpu_gpt, gpt2_small, train, train_on_rank

MODELS = {"cpu": cpu_gpt, "gpt2": gpt2_small}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train the course's GPT with any strategy.")
    p.add_argument("--strategy", default="ddp", help=f"one of {', '.join(STRATEGIES)}")
    for axis in ("dp", "tp", "pp", "cp"):
        p.add_argument(f"--{axis}", type=int, default=None if axis == "dp" else 1,
                       help="dp defaults to world size / (tp pp cp)" if axis == "dp" else None)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--model", choices=sorted(MODELS), default="cpu")
    for name in ("layers", "d-model", "heads", "context"):
        p.add_argument(f"--{name}", type=int, default=None, help="override the model's")
    p.add_argument("--tokens", help="a token file (uint16/uint32 ids; meta.json beside it)")
    p.add_argument("--val-tokens")
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--max-bytes", type=int, default=None, help="corpus bytes to tokenize")
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--fail-at", type=int, default=None,
                   help="SIGKILL --fail-rank at this step (needs --checkpoint-every <= it)")
    p.add_argument("--fail-rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=None, help="ranks, without torchrun")
    p.add_argument("--peak-flops", type=float, default=None,
                   help="one device's peak FLOP/s for MFU (default: a measured fp32 matmul)")
    p.add_argument("--emulate", default=None, metavar="PRESET",
                   help="time the steps as an emulated cluster would run them (h100-node, ...)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="under torchrun: seconds a rank may spend joining the group, in one "
                        "step, a checkpoint or the final barrier before it ends with a "
                        "message saying what it waited for")
    p.add_argument("--out", help="write rank 0's result here as JSON")
    return p


def _data(args) -> tuple[str, str | None, int]:
    """Token files and vocabulary size: the given ones, or the capstone corpus's."""
    if args.tokens:
        meta = Path(args.tokens).with_name("meta.json")
        vocab = args.vocab_size or (json.loads(meta.read_text())["vocab_size"]
                                    if meta.is_file() else None)
        if vocab is None:
            raise ValueError("--tokens without a meta.json beside it needs --vocab-size")
        return args.tokens, args.val_tokens, vocab
    from .tokens import build_token_files  # noqa: PLC0415  (tokenizers: only when building data)
    files = build_token_files(vocab_size=args.vocab_size or 4096, max_bytes=args.max_bytes)
    return str(files.train), str(files.val), files.vocab_size


def config_from_args(args, world_size: int) -> TrainConfig:
    tokens, val, vocab = _data(args)
    model = MODELS[args.model](vocab)
    overrides = {"n_layers": args.layers, "d_model": args.d_model, "n_heads": args.heads,
                 "seq_len": args.context}
    model = GPTConfig(**{**model.__dict__, "d_ff": 0,
                         **{k: v for k, v in overrides.items() if v is not None}})
    others = args.tp * args.pp * args.cp
    dp = args.dp if args.dp is not None else max(world_size // others, 1)
    dims = ParallelDims(dp=dp, tp=args.tp, pp=args.pp, cp=args.cp,
                        microbatches=args.microbatches, schedule=args.schedule)
    return TrainConfig(model=model, tokens=tokens, val_tokens=val, strategy=args.strategy,
                       dims=dims,
                       global_batch=args.batch, steps=args.steps, lr=args.lr, seed=args.seed,
                       data_seed=args.data_seed, log_every=args.log_every,
                       checkpoint_dir=args.checkpoint_dir,
                       checkpoint_every=args.checkpoint_every, fail_at=args.fail_at,
                       fail_rank=args.fail_rank, peak_flops=args.peak_flops,
                       emulate=args.emulate)


def _summary(result: dict) -> dict:
    return {"final_loss": result["losses"][-1] if result["losses"] else None,
            "first_step": result["first_step"], "resumed_from": result["resumed_from"]}


def _rank_main(cfg: TrainConfig, out: str | None) -> dict:
    result = train_on_rank(cfg)
    if out and int(os.environ.get("RANK", 0)) == 0:
        Path(out).write_text(json.dumps(result, default=str))
    return _summary(result)


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    torchrun = "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if torchrun else args.world_size
    check_failure(args.fail_at, args.fail_rank, world, args.checkpoint_dir,  # before the data
                  args.checkpoint_every, args.steps)
    cfg = config_from_args(args, world or 1)
    check_config(cfg, world or cfg.world_size)             # before any rank trains
    if torchrun:
        return torchrun_main(_rank_main, cfg, args.out, timeout=args.timeout)
    result = train(cfg)
    if args.out:
        Path(args.out).write_text(json.dumps(result, default=str))
    print(_summary(result))
    return result
