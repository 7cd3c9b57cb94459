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
``--out`` writes rank 0's result with the record of :mod:`.report` (step time, tokens/s,
MFU, memory per GPU, how it was timed, the settings).

The prediction (:mod:`.predict`): ``--emulate h100-node --dry-run`` times GPT-2 small (124M,
1024 tokens) with every strategy on 4 and 8 emulated GPUs, computing nothing, and prints
(and writes to ``--out``) the same records; ``--strategy`` and ``--world-size`` pick some:

    python examples/train_gpt2.py --emulate h100-node --dry-run
    python examples/train_gpt2.py --emulate a100-node --dry-run --strategy fsdp --world-size 8
    python -m lecture_lib.capstone compare predicted.json measured.json --png compare.png
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..dims import ParallelDims, Recipe
from ..models import REAL_SIZE, GPTConfig
from .elastic import DEFAULT_TIMEOUT, check_failure, torchrun_main
from .predict import GLOBAL_BATCH, predict_strategies
from .report import format_table, run_record
from .strategies import STRATEGIES
from .train import PRECISIONS, TrainConfig, check_config, cpu_gpt, gpt2_small, train, train_on_rank

MODELS = {"cpu": cpu_gpt, "gpt2": gpt2_small}
DRY_RUN_WORLD_SIZES = (4, 8)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train the course's GPT with any strategy, or "
                                            "predict its step on emulated GPUs (--dry-run).")
    p.add_argument("--strategy", default=None,
                   help=f"one of {', '.join(STRATEGIES)} (default ddp; --dry-run: all of them, "
                        "or some: ddp,fsdp)")
    for axis in ("dp", "tp", "pp", "cp"):
        p.add_argument(f"--{axis}", type=int, default=None if axis == "dp" else 1,
                       help="dp defaults to world size / (tp pp cp)" if axis == "dp" else None)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32",
                   help="bf16: autocast, as the prediction assumes")
    p.add_argument("--model", choices=sorted(MODELS), default="cpu")
    for name in ("layers", "d-model", "heads", "context"):
        p.add_argument(f"--{name}", type=int, default=None, help="override the model's")
    p.add_argument("--tokens", help="a token file (uint16/uint32 ids; meta.json beside it)")
    p.add_argument("--val-tokens")
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--max-bytes", type=int, default=None, help="corpus bytes to tokenize")
    p.add_argument("--batch", type=int, default=None,
                   help="global batch in sequences (default 8; --dry-run: 64)")
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
    p.add_argument("--world-size", type=int, nargs="+", default=None,
                   help="ranks, without torchrun (--dry-run: one or more, default 4 8)")
    p.add_argument("--peak-flops", type=float, default=None,
                   help="one device's peak FLOP/s for MFU (default: a measured fp32 matmul)")
    p.add_argument("--emulate", default=None, metavar="PRESET",
                   help="time the steps as an emulated cluster would run them (h100-node, ...)")
    p.add_argument("--dry-run", action="store_true",
                   help="with --emulate: predict GPT-2 small's step per strategy on fake "
                        "tensors (nothing computed, nothing trained)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="under torchrun: seconds a rank may spend joining the group, in one "
                        "step, a checkpoint or the final barrier before it ends with a "
                        "message saying what it waited for")
    p.add_argument("--out", help="write rank 0's result (or the predicted records) as JSON")
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


def _model(args, base: GPTConfig) -> GPTConfig:
    overrides = {"n_layers": args.layers, "d_model": args.d_model, "n_heads": args.heads,
                 "seq_len": args.context}
    derived = {"d_ff": 0, "n_kv_heads": 0}     # 4 d and every head again, of the new shape
    return GPTConfig(**{**base.__dict__, **derived,
                        **{k: v for k, v in overrides.items() if v is not None}})


def config_from_args(args, world_size: int) -> TrainConfig:
    tokens, val, vocab = _data(args)
    others = args.tp * args.pp * args.cp
    dp = args.dp if args.dp is not None else max(world_size // others, 1)
    dims = ParallelDims(dp=dp, tp=args.tp, pp=args.pp, cp=args.cp)
    recipe = Recipe(microbatches=args.microbatches, schedule=args.schedule)
    return TrainConfig(model=_model(args, MODELS[args.model](vocab)), tokens=tokens,
                       val_tokens=val, strategy=args.strategy or "ddp", dims=dims,
                       recipe=recipe, precision=args.precision, global_batch=args.batch or 8,
                       steps=args.steps, lr=args.lr, seed=args.seed, data_seed=args.data_seed,
                       log_every=args.log_every, checkpoint_dir=args.checkpoint_dir,
                       checkpoint_every=args.checkpoint_every, fail_at=args.fail_at,
                       fail_rank=args.fail_rank, peak_flops=args.peak_flops,
                       emulate=args.emulate)


def _summary(result: dict) -> dict:
    return {"final_loss": result["losses"][-1] if result["losses"] else None,
            "first_step": result["first_step"], "resumed_from": result["resumed_from"]}


def _write(out: str | None, cfg: TrainConfig, result: dict) -> None:
    if out:
        Path(out).write_text(json.dumps({**result, **run_record(cfg, result)}, default=str))


def _rank_main(cfg: TrainConfig, out: str | None) -> dict:
    result = train_on_rank(cfg)
    if int(os.environ.get("RANK", 0)) == 0:
        _write(out, cfg, result)
    return _summary(result)


def dry_run(args) -> list[dict]:
    """``--emulate PRESET --dry-run``: the predicted records, printed and written."""
    if not args.emulate:
        raise ValueError("--dry-run predicts an emulated run: give --emulate PRESET "
                         "(h100-node, a100-node, ...)")
    if "WORLD_SIZE" in os.environ:
        raise ValueError("--dry-run starts its own emulated ranks: run it with plain python, "
                         "not under torchrun")
    strategies = STRATEGIES if args.strategy in (None, "all") else tuple(args.strategy.split(","))
    records = predict_strategies(tuple(args.world_size or DRY_RUN_WORLD_SIZES), (args.emulate,),
                                 strategies, _model(args, REAL_SIZE["GPT-2 small"]),
                                 args.batch or GLOBAL_BATCH)
    print(format_table(records))
    if args.out:
        Path(args.out).write_text(json.dumps(records, default=str, indent=1))
    return records


def main(argv=None) -> dict | list[dict]:
    args = parser().parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    torchrun = "WORLD_SIZE" in os.environ
    if args.world_size is not None and len(args.world_size) != 1:
        raise ValueError("--world-size takes one number, except with --dry-run")
    world = int(os.environ["WORLD_SIZE"]) if torchrun else (args.world_size or [None])[0]
    check_failure(args.fail_at, args.fail_rank, world, args.checkpoint_dir,  # before the data
                  args.checkpoint_every, args.steps)
    cfg = config_from_args(args, world or 1)
    check_config(cfg, world or cfg.world_size)             # before any rank trains
    if torchrun:
        return torchrun_main(_rank_main, cfg, args.out, timeout=args.timeout)
    result = train(cfg)
    _write(args.out, cfg, result)
    print(_summary(result))
    return result
