"""Debugging distributed training: is the wiring right, do the replicas agree, does it converge?

The idea
--------
Most distributed-training bugs are silent: the job runs, the loss even falls,
but the replicas have drifted apart or the update is the wrong size. The
lecture's checklist ("common problems and debugging"), each a tool here:

1. **Communication sanity check** (:func:`check_communication`): every rank
   all-reduces a known value; the result must be exact and arrive in time.
   Run it first; a broken network, a wrong world size or a rank on the wrong
   device shows up here, not three hours into training.
2. **Gradient consistency** (:func:`check_gradient_consistency`): after the
   gradient sync every data-parallel replica must hold the *same* gradient and,
   after the step, the same parameters (Li et al. 2020, "PyTorch Distributed",
   VLDB: DDP's guarantee). The check names the first parameter that differs,
   by how much and on which rank. It cannot see a bug every rank makes alike
   (gradients *summed* instead of averaged): for that, compare with one process
   (:func:`lecture_lib.models.assert_same_training`).
3. **Hangs** (:func:`hang_report`): a rank that skips or reorders a collective
   leaves the others waiting forever. ``lecture_lib.run(..., timeout=...)``
   turns the hang into :class:`lecture_lib.RankTimeout` with every rank's
   stack; :func:`hang_report` says, per rank, where it was.
4. **Convergence** (:func:`train_gpt`, :func:`sweep`): gradient clipping
   against a learning rate that diverges (Pascanu et al. 2013); the linear
   scaling rule with warm-up (Goyal et al. 2017, "Accurate, Large Minibatch
   SGD"); determinism: the same seed gives the same losses bit for bit, and a
   different reduction order (another batch split) does not.

:func:`sync_gradients` is the plain hand-written gradient sync (one
all-reduce per gradient, or one flat message) that the planted bugs of
notebook 08 break.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .metrics import wall_time

# ----------------------------------------------------------------------------
# The plain gradient sync
# ----------------------------------------------------------------------------


def sync_gradients(model: torch.nn.Module, op: str = "mean", flat: bool = False,
                   skip: tuple[str, ...] = (), group=None) -> None:
    """All-reduce every parameter's gradient across ``group``, averaged (``op="mean"``).

    ``flat=True`` sends all gradients as one message (a single "bucket"), else one
    all-reduce per parameter. ``op="sum"`` and ``skip`` (parameter names left
    unsynchronised) exist to plant the bugs the debugging tools must find.
    """
    if op not in ("mean", "sum"):
        raise ValueError(f"op must be 'mean' or 'sum', not {op!r}")
    names = {n for n, _ in model.named_parameters()}
    unknown = set(skip) - names
    if unknown:
        raise ValueError(f"skip names no parameter of the model: {sorted(unknown)}")
    size = dist.get_world_size(group)
    grads = [p.grad for n, p in model.named_parameters() if p.grad is not None and n not in skip]
    if not grads:
        return
    if flat:
        buffer = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(buffer, group=group)
        if op == "mean":
            buffer /= size
        offset = 0
        for g in grads:
            g.copy_(buffer[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        return
    for g in grads:
        dist.all_reduce(g, group=group)
        if op == "mean":
            g /= size


# ----------------------------------------------------------------------------
# 1. Communication sanity check
# ----------------------------------------------------------------------------

@dataclass
class CommCheck:
    rank: int
    world_size: int
    expected: float
    wrong_elements: int       # elements of the result that differ from expected
    seconds: float
    nbytes: int

    @property
    def ok(self) -> bool:
        return self.wrong_elements == 0

    @property
    def bus_gbps(self) -> float:
        """All-reduce bus bandwidth in GB/s (nccl-tests' definition, see costmodel.comm)."""
        from .costmodel import bus_factor
        return self.nbytes / self.seconds * bus_factor("all_reduce", self.world_size) / 1e9


def check_communication(numel: int = 1 << 18, max_seconds: float = 10.0,
                        dtype=torch.float32) -> CommCheck:
    """On every rank: all-reduce a tensor filled with ``rank + 1``; check and time it.

    Every element must equal ``1 + 2 + ... + world_size`` exactly (small whole
    numbers add exactly in floating point), and the all-reduce must take under
    ``max_seconds``. Raises AssertionError naming the rank otherwise; returns
    the measurement.
    """
    from .launch import device
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise ValueError(f"numel must be a whole number >= 1, not {numel!r}")
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, not {max_seconds!r}")
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.full((numel,), float(rank + 1), dtype=dtype, device=device())
    dist.all_reduce(x)                       # a first, untimed call sets up the connections
    x.fill_(float(rank + 1))
    with wall_time(x.device) as t:
        dist.all_reduce(x)
    expected = size * (size + 1) / 2
    check = CommCheck(rank, size, expected, int((x != expected).sum().item()), t.seconds,
                      numel * x.element_size())
    if not check.ok:
        raise AssertionError(f"rank {rank}: all-reduce of rank+1 gave wrong values in "
                             f"{check.wrong_elements} of {numel} elements (expected {expected:g}, "
                             f"e.g. got {x[(x != expected).nonzero()[0]].item():g})")
    if check.seconds > max_seconds:
        raise AssertionError(f"rank {rank}: all-reduce of {check.nbytes} bytes took "
                             f"{check.seconds:.3g} s > {max_seconds:g} s")
    return check


def comm_sanity_check(world_size: int, numel: int = 1 << 18, max_seconds: float = 10.0,
                      timeout: float = 60) -> list[CommCheck]:
    """:func:`check_communication` on ``world_size`` ranks; one :class:`CommCheck` per rank."""
    from . import launch
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise ValueError(f"numel must be a whole number >= 1, not {numel!r}")
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, not {max_seconds!r}")
    return launch.run(check_communication, world_size, numel, max_seconds, timeout=timeout)


# ----------------------------------------------------------------------------
# 2. Gradient consistency across data-parallel replicas
# ----------------------------------------------------------------------------

@dataclass
class Inconsistency:
    """The first parameter whose gradient or value differs between replicas."""
    name: str
    kind: str            # "grad", "value" or "missing grad"
    max_abs_diff: float  # against rank 0's copy (inf for a missing gradient)
    rank: int            # the rank that differs most from rank 0

    def __str__(self):
        return (f"{self.kind} of parameter {self.name!r} differs between replicas: rank "
                f"{self.rank} is {self.max_abs_diff:.3e} away from rank 0")


def check_gradient_consistency(model: torch.nn.Module, *, grads: bool = True,
                               values: bool = True, rtol: float = 1e-6, atol: float = 1e-7,
                               group=None) -> Inconsistency | None:
    """Compare every replica's gradients and parameter values with rank 0's.

    Call it on every rank of a data-parallel group after the gradient sync (and,
    for values, after the optimizer step). Two collectives in all: rank 0's
    tensors are broadcast as one flat buffer, then every rank's per-parameter
    differences are all-gathered. Returns the same answer on every rank: the
    first parameter (in ``named_parameters`` order; the gradient before the
    value) that differs by more than ``atol + rtol * max|rank 0's|``, or None.
    """
    from .launch import device
    if not (grads or values):
        raise ValueError("check at least one of grads and values")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    kinds = (["grad"] if grads else []) + (["value"] if values else [])
    dev = device()
    tensors, has_grad = [], []
    for _, p in named:
        for kind in kinds:
            t = p.detach() if kind == "value" else p.grad
            has_grad.append(0.0 if t is None else 1.0)
            tensors.append((torch.zeros_like(p) if t is None else t).detach().reshape(-1).float())
    mine = torch.cat(tensors).to(dev)
    ref = mine.clone()
    dist.broadcast(ref, dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    diffs, scale = [], []
    offset = 0
    for t in tensors:
        a, b = mine[offset:offset + t.numel()], ref[offset:offset + t.numel()]
        diffs.append((a - b).abs().max() if t.numel() else torch.zeros((), device=dev))
        scale.append(b.abs().max() if t.numel() else torch.zeros((), device=dev))
        offset += t.numel()
    local = torch.stack([torch.stack(diffs), torch.stack(scale),
                         torch.tensor(has_grad, device=dev)])
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    every = torch.stack(gathered).cpu()          # (ranks, 3, entries)
    entries = [(name, kind) for name, _ in named for kind in kinds]
    for i, (name, kind) in enumerate(entries):
        present = every[:, 2, i]
        if kind == "grad" and present.min() != present.max():
            rank = int((present != present[0]).nonzero()[0])
            return Inconsistency(name, "missing grad", math.inf, rank)
        d = every[:, 0, i]
        limit = atol + rtol * float(every[0, 1, i])
        if float(d.max()) > limit or not torch.isfinite(d).all():
            rank = int(torch.nan_to_num(d, nan=math.inf).argmax())
            return Inconsistency(name, kind, float(d[rank]), rank)
    return None


def assert_consistent(model: torch.nn.Module, **kwargs) -> None:
    """:func:`check_gradient_consistency`, raising AssertionError with its finding."""
    found = check_gradient_consistency(model, **kwargs)
    if found is not None:
        raise AssertionError(str(found))


# ----------------------------------------------------------------------------
# 3. Hangs
# ----------------------------------------------------------------------------

def skipped_collective(skip_rank: int = 1, numel: int = 4) -> str:
    """A rank function with a planted hang: every rank but ``skip_rank`` all-reduces.

    The others wait in ``all_reduce`` for a partner that never comes; run it with
    ``lecture_lib.run(skipped_collective, n, timeout=small)`` to see the launcher
    turn the hang into :class:`lecture_lib.RankTimeout`.
    """
    x = torch.ones(numel)
    if dist.get_rank() != skip_rank:
        dist.all_reduce(x)                    # the skipping rank never joins this one
    return "returned"


def hang_report(error) -> dict[int, str]:
    """Per rank, where it was when a :class:`lecture_lib.RankTimeout` ended the call.

    A stuck rank's entry is the innermost frame of its stack (file:line in
    function); a rank that had finished says so.
    """
    from .launch import RankTimeout
    if not isinstance(error, RankTimeout):
        raise TypeError(f"expected a RankTimeout, not {type(error).__name__}")
    report = {}
    for rank, stack in sorted(error.stacks.items()):
        if stack.startswith("finished"):
            report[rank] = "finished (returned from the function)"
            continue
        frames = [ln.strip() for ln in stack.splitlines() if ln.strip().startswith("File ")]
        report[rank] = "stuck at " + (frames[0] if frames else stack.strip()[:200])
    return report


# ----------------------------------------------------------------------------
# 4. Convergence experiments on the small GPT
# ----------------------------------------------------------------------------

def train_gpt(cfg=None, *, steps: int = 40, lr: float = 0.1, batch_size: int = 8,
              optimizer: str = "sgd", clip: float | None = None, warmup: int = 0,
              seed: int = 0, data_seed: int = 0, micro_batches: int = 1) -> dict:
    """Train the small GPT in this process on :class:`MarkovText`; losses and gradient norms.

    ``clip``: clip the global gradient norm to this value
    (``torch.nn.utils.clip_grad_norm_``). ``warmup``: raise the learning rate
    linearly from ``lr / warmup`` to ``lr`` over the first ``warmup`` steps.
    ``micro_batches``: accumulate the same batch in this many pieces (the same
    mathematics, another order of floating-point additions). A loss that
    becomes inf or nan ends the run early (the rest are reported as nan).
    """
    from .models import GPT, GPTConfig, MarkovText, make_optimizer
    cfg = cfg or GPTConfig(d_model=32, n_layers=2, seq_len=16, n_heads=2)
    for name, v in (("steps", steps), ("batch_size", batch_size),
                    ("micro_batches", micro_batches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
    if batch_size % micro_batches:
        raise ValueError(f"batch_size={batch_size} is not divisible by "
                         f"micro_batches={micro_batches}")
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
        for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            part = model(xs, ys) / micro_batches
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
    ``r, r + world_size, ...``; results come back in the order of ``configs``.
    """
    from . import launch
    configs = list(configs)
    if not configs:
        raise ValueError("configs is empty")
    for c in configs:
        if not isinstance(c, dict):
            raise TypeError(f"each config must be a dict of train_gpt arguments, not {c!r}")
    world_size = max(1, min(world_size, len(configs)))

    def rank_fn():
        r = dist.get_rank()
        return [train_gpt(**c) for c in configs[r::world_size]]

    per_rank = launch.run(rank_fn, world_size, timeout=timeout)
    out = [None] * len(configs)
    for r, results in enumerate(per_rank):
        for k, res in enumerate(results):
            out[r + k * world_size] = res
    return out
