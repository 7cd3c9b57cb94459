"""Memory efficiency on one device: mixed precision and activation checkpointing.

Mixed precision (Micikevicius et al. 2018, "Mixed Precision Training"): the
model computes in 16-bit floats (bf16 or fp16), so its parameters, gradients
and activations take 2 bytes per number, while the optimizer updates fp32
*master* copies of the weights (small updates would vanish when added to a
16-bit weight). Adam then holds, per parameter, 2 (bf16 weights) + 2 (bf16
gradients) + 4 (fp32 master) + 8 (fp32 moments) = 16 bytes: the "2 + 2 + K,
K = 12" of the ZeRO paper. fp16 has a narrow exponent range, so small
gradients underflow to zero: *dynamic loss scaling* multiplies the loss by S
before backward, divides the gradients by S, skips the step and halves S when
any gradient overflowed, and doubles S after a run of good steps. bf16 has
fp32's exponent range and needs no scaling.

Activation checkpointing (Chen et al. 2016, "Training Deep Nets with
Sublinear Memory Cost"): keep only each block's input in forward and
recompute the block's internals in backward; activation memory falls from
``L x (a block's activations)`` to ``L x (one input) + one block's
activations``, for one more forward pass (about a third more compute).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from .metrics import saved_tensor_bytes, state_bytes, tensor_bytes

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class LossScaler:
    """Dynamic loss scaling (Micikevicius et al. 2018), for any training loop.

    ``(loss * scaler.scale).backward()``; ``finite = scaler.unscale_(params)``
    divides their ``.grad`` by the scale and says whether all are finite; step
    only if so; then ``scaler.update(finite)`` halves the scale after an
    overflow and doubles it after ``growth_interval`` good steps. ``dtype``
    other than ``"fp16"`` keeps the scale fixed (1 by default).
    """

    def __init__(self, dtype: str = "fp16", loss_scale: float | None = None,
                 growth_interval: int = 100):
        if growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, not {growth_interval}")
        if loss_scale is None:
            loss_scale = 2.0 ** 16 if dtype == "fp16" else 1.0
        if loss_scale <= 0:
            raise ValueError(f"loss_scale must be positive, not {loss_scale}")
        self.scale = float(loss_scale)
        self.dynamic = dtype == "fp16"
        self.growth_interval, self._good = growth_interval, 0
        self.skipped = 0

    @torch.no_grad()
    def unscale_(self, params) -> bool:
        finite = True
        for p in params:
            if p.grad is not None:
                p.grad.div_(self.scale)
                finite = finite and bool(torch.isfinite(p.grad).all())
        return finite

    def update(self, finite: bool) -> None:
        if not self.dynamic:
            return
        if not finite:
            self.scale /= 2
            self.skipped += 1
            self._good = 0
        else:
            self._good += 1
            if self._good % self.growth_interval == 0:
                self.scale *= 2


class MixedPrecisionTrainer:
    """Train ``model`` in 16-bit with fp32 master weights; ``trainer.step(x, y) -> loss``.

    ``dtype``: ``"bf16"`` or ``"fp16"`` (dynamic loss scaling on by default
    for fp16) or ``"fp32"`` (plain training, for comparison). The model is cast
    in place; ``master`` holds the fp32 weights the optimizer steps.
    """

    def __init__(self, model: nn.Module, dtype: str = "bf16", lr: float = 1e-2,
                 weight_decay: float = 0.01, loss_scale: float | None = None,
                 growth_interval: int = 100):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, not {dtype!r}")
        self.dtype = DTYPES[dtype]
        self.model = model
        self.master = [p.detach().float().clone().requires_grad_(p.requires_grad)
                       for p in model.parameters()]
        model.to(self.dtype)
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, weight_decay=weight_decay)
        self.scaler = LossScaler(dtype, loss_scale, growth_interval)

    def step(self, x, y) -> float:
        """One forward, backward and (unless the gradients overflowed) optimizer step."""
        for p in self.model.parameters():
            p.grad = None
        loss = self.model(x, y)
        (loss.float() * self.scaler.scale).backward()
        with torch.no_grad():
            for p, m in zip(self.model.parameters(), self.master):
                m.grad = None if p.grad is None else p.grad.float()
            finite = self.scaler.unscale_(self.master)
            if finite:
                self.optimizer.step()
                for p, m in zip(self.model.parameters(), self.master):
                    p.copy_(m)               # round the fp32 master back to 16 bits
            for m in self.master:
                m.grad = None                # fp32 gradients live only during the step
        self.scaler.update(finite)
        return loss.item()

    @property
    def scale(self) -> float:
        return self.scaler.scale

    @property
    def skipped(self) -> int:
        return self.scaler.skipped

    def held_bytes(self) -> dict:
        """Bytes held between steps: model params and grads; master weights + moments."""
        held = state_bytes(self.model, self.optimizer)
        held["optimizer"] += tensor_bytes(self.master)
        return held


FP16_SMALLEST_NORMAL = 2.0 ** -14     # below it fp16 keeps fewer significant bits (subnormal)


def fp16_underflow(make_model, x, y, scales=(1.0, 2.0 ** 16), autocast: bool = False) -> dict:
    """What an fp16 backward does to the gradients, at each loss scale.

    The fp32 backward of ``make_model()`` on ``(x, y)`` is the reference: its nonzero gradient
    values. For each scale S a fresh ``make_model()`` runs backward on S x loss, in one of two
    recipes. ``autocast=False``: the model is cast to fp16, its loss included (the recipe of
    :class:`MixedPrecisionTrainer`). ``autocast=True``: the model stays fp32 and its forward runs
    under ``torch.autocast`` in fp16, which computes the matrix products in fp16 and the loss in
    fp32; ``torch.amp.GradScaler`` scales the loss.

    Per scale: ``"nonzero"`` (the reference's count); of those, ``"zero"`` (lost: underflow)
    and ``"below fp16 normal"`` (nonzero but below fp16's smallest normal, 2^-14: in an fp16
    tensor, a subnormal with fewer bits); ``"not finite"`` (inf or NaN: overflow); ``"error
    p90"``, the 90th percentile of the relative error of the unscaled gradients against the
    reference (NaN after an overflow). ``make_model`` must build the same weights at every call.
    """
    if any(s <= 0 for s in scales):
        raise ValueError(f"scales must be positive, not {scales}")
    ref = make_model()
    ref(x, y).float().backward()
    want = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    nonzero = {n: g != 0 for n, g in want.items()}
    out = {}
    for s in scales:
        model = make_model()
        if autocast:
            with torch.autocast(x.device.type, dtype=torch.float16):
                loss = model(x, y)
            torch.amp.GradScaler(x.device.type, init_scale=s).scale(loss).backward()
        else:
            model.to(torch.float16)
            (model(x, y).float() * s).backward()
        grad = {n: p.grad for n, p in model.named_parameters()}
        kept = torch.cat([grad[n][m].float() for n, m in nonzero.items()])
        ref_kept = torch.cat([want[n][m] for n, m in nonzero.items()])
        finite = bool(torch.isfinite(kept).all())
        error = ((kept / s - ref_kept).abs() / ref_kept.abs()).quantile(0.9).item() if finite \
            else float("nan")
        out[s] = {"nonzero": kept.numel(),
                  "zero": int((kept == 0).sum()),
                  "below fp16 normal": int(((kept != 0)
                                            & (kept.abs() < FP16_SMALLEST_NORMAL)).sum()),
                  "not finite": sum(int((~torch.isfinite(grad[n])).sum()) for n in nonzero),
                  "error p90": error}
    return out


def train_precision(make_model, batches, steps: int, dtype: str = "bf16", lr: float = 1e-2,
                    **kwargs) -> dict:
    """Train a fresh ``make_model()`` with :class:`MixedPrecisionTrainer`; losses and bytes."""
    trainer = MixedPrecisionTrainer(make_model(), dtype, lr, **kwargs)
    losses = [trainer.step(*batches(step)) for step in range(steps)]
    n = sum(p.numel() for p in trainer.model.parameters())
    held = trainer.held_bytes()
    return {"losses": losses, "held": held, "bytes_per_param": sum(held.values()) / n,
            "skipped": trainer.skipped, "scale": trainer.scale}


# ----------------------------------------------------------------------------
# Activation checkpointing
# ----------------------------------------------------------------------------

def checkpoint_blocks(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Recompute each of ``model.blocks`` in backward instead of keeping its activations.

    Parameters and their names are unchanged, so the model trains (and
    compares) exactly as before; ``enabled=False`` undoes it.
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise TypeError(f"{type(model).__name__} has no .blocks to checkpoint")
    for block in blocks:
        if "forward" in vars(block):          # undo an earlier wrapping first
            del block.forward
        if enabled:
            plain = block.forward
            block.forward = lambda *args, plain=plain: checkpoint(plain, *args,
                                                                 use_reentrant=False)
    return model


def activation_profile(model: nn.Module, x, y, checkpointing: bool) -> dict:
    """Activation bytes autograd keeps (saved-tensor hooks) and FLOPs of a training step.

    Returns ``activation_bytes`` (saved bytes less the parameters) and ``step_flops``
    (FLOPs of one forward + backward, counted by ``torch.utils.flop_counter``, the
    recomputed forward included): counted, not timed (its time at real size:
    :func:`lecture_lib.zero.emulated.time_at_scale` with ``checkpointing=True``).
    """
    checkpoint_blocks(model, checkpointing)
    try:
        with saved_tensor_bytes() as saved:
            loss = model(x, y)
        loss.backward()
        model.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False) as counter:
            model(x, y).backward()
        model.zero_grad(set_to_none=True)
    finally:
        checkpoint_blocks(model, False)
    return {"activation_bytes": saved.activation_bytes(model),
            "step_flops": counter.get_total_flops()}
