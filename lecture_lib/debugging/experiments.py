"""Convergence experiments on the small GPT (what notebook 09's section 5 runs).

Gradient clipping against a learning rate that diverges (Pascanu et al.
2013); the linear scaling rule with warm-up (Goyal et al. 2017, "Accurate,
Large Minibatch SGD"); determinism: the same seed gives the same losses bit
for bit, and a different reduction order (another batch split) does not.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..models import GPT, GPTConfig, MarkovText, make_optimizer
from ..progress import progress
from ..runtime import launch


def train_gpt(cfg=None, *, steps: int = 40, lr: float = 0.1, batch_size: int = 8,
              optimizer: str = "sgd", clip: float | None = None, warmup: int = 0,
              seed: int = 0, data_seed: int = 0, microbatches: int = 1) -> dict:
    """Train the small GPT in this process on :class:`MarkovText`; losses and gradient norms.

    ``clip``: clip the global gradient norm to this value
    (``torch.nn.utils.clip_grad_norm_``). ``warmup``: raise the learning rate
    linearly from ``lr / warmup`` to ``lr`` over the first ``warmup`` steps.
    ``microbatches``: accumulate the same batch in this many pieces (the same
    mathematics, another order of floating-point additions). A loss that
    becomes inf or nan ends the run early (the rest are reported as nan).
    """
    cfg = cfg or GPTConfig(d_model=32, n_layers=2, seq_len=16, n_heads=2)
    for name, v in (("steps", steps), ("batch_size", batch_size),
                    ("microbatches", microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
    if batch_size % microbatches:
        raise ValueError(f"batch_size={batch_size} is not divisible by "
                         f"microbatches={microbatches}")
    if not lr > 0 or warmup < 0 or (clip is not None and not clip > 0):
        raise ValueError(f"need lr > 0, warmup >= 0 and clip > 0 or None "
                         f"(got lr={lr}, warmup={warmup}, clip={clip})")
    torch.manual_seed(seed)
    model, data = GPT(cfg, seed), MarkovText(cfg.vocab_size, cfg.seq_len, data_seed)
    opt = make_optimizer(model.parameters(), optimizer, lr)
    losses, norms = [], []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup) if warmup else lr
        x, y = data.batch(step, batch_size)
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for xs, ys in zip(x.chunk(microbatches), y.chunk(microbatches)):
            part = model(xs, ys) / microbatches
            part.backward()
            loss += part.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                              clip if clip is not None else math.inf)
        losses.append(loss)
        norms.append(float(norm))
        if not math.isfinite(loss) or not math.isfinite(float(norm)):
            losses += [math.nan] * (steps - step - 1)
            break
        opt.step()
    return {"losses": losses, "grad_norms": norms}


def sweep(configs: list[dict], world_size: int = 2, timeout: float = 120) -> list[dict]:
    """Run :func:`train_gpt` for each config, spread over ``world_size`` processes.

    The runs are independent (no communication): rank ``r`` trains configs
    ``r, r + world_size, ...``, one round of ``world_size`` configs per call of the
    ranks (so that :func:`~lecture_lib.progress.progress` can count the rounds;
    ``timeout`` is each round's); results come back in the order of ``configs``.
    """
    configs = list(configs)
    if not configs:
        raise ValueError("configs is empty")
    for c in configs:
        if not isinstance(c, dict):
            raise TypeError(f"each config must be a dict of train_gpt arguments, not {c!r}")
    world_size = max(1, min(world_size, len(configs)))

    def one_round(batch):              # rank r trains batch[r], if the round has one
        r = dist.get_rank()
        return train_gpt(**batch[r]) if r < len(batch) else None

    rounds = [configs[i:i + world_size] for i in range(0, len(configs), world_size)]
    out = []
    for batch in progress(rounds, f"sweep: {len(configs)} runs, {world_size} at a time"):
        out += launch.run(one_round, world_size, batch, timeout=timeout)[:len(batch)]
    return out
