"""Is the wiring right, do the replicas agree? Two checks to run before trusting a job.

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
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..costmodel import bus_factor
from ..metrics import wall_time
from ..runtime import launch


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
        return self.nbytes / self.seconds * bus_factor("all_reduce", self.world_size) / 1e9


def check_communication(numel: int = 1 << 18, max_seconds: float = 10.0,
                        dtype=torch.float32) -> CommCheck:
    """On every rank: all-reduce a tensor filled with ``rank + 1``; check and time it.

    Every element must equal ``1 + 2 + ... + world_size`` exactly (small whole
    numbers add exactly in floating point), and the all-reduce must take under
    ``max_seconds``. Raises AssertionError naming the rank otherwise; returns
    the measurement.
    """
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise ValueError(f"numel must be a whole number >= 1, not {numel!r}")
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, not {max_seconds!r}")
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.full((numel,), float(rank + 1), dtype=dtype, device=launch.device())
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
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise ValueError(f"numel must be a whole number >= 1, not {numel!r}")
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, not {max_seconds!r}")
    return launch.run(check_communication, world_size, numel, max_seconds, timeout=timeout)


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
    if not (grads or values):
        raise ValueError("check at least one of grads and values")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    kinds = (["grad"] if grads else []) + (["value"] if values else [])
    dev = launch.device()
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
