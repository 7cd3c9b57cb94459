"""FSDP's wrap policy: which submodules become units, and their parameters made shards.

A *unit* is a submodule whose parameters are all-gathered, used and freed together
(Zhao et al. 2023, "PyTorch FSDP", section 3.1; FSDP2's ``fully_shard(submodule)``).
Small units keep little gathered at once but send many small messages; large ones the
reverse. The default policy, as Stanford CS336 (2026) and torchtitan wrap a transformer:
every transformer block (the GPT's ``blocks``) and every ``nn.Linear`` and
``nn.Embedding`` outside them. A user passes a predicate ``policy(module) -> bool`` (the
outermost match wins) or a list of submodules instead.

Parameters outside every unit (the final LayerNorm of the course's GPT) stay
*replicated*: every rank holds them whole and their gradients are all-reduced. A
parameter shared by two units (tied weights) stays replicated too, so that neither unit
frees what the other still uses. The policy runs before any process starts, so bad input
fails early (:func:`check_fsdp`).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .shards import chunk_size, padded_flat
from .units import ParamSlot


def check_fsdp(module: nn.Module, units=None, compute_dtype=None) -> None:
    """Every check of :class:`~.fsdp.FullyShardedModel`'s arguments, before any process starts."""
    resolve_units(module, units)
    check_compute_dtype(compute_dtype)


def check_compute_dtype(compute_dtype) -> torch.dtype | None:
    """``None`` (compute in the parameters' own dtype) or a floating-point ``torch.dtype``."""
    if compute_dtype is None:
        return None
    if not isinstance(compute_dtype, torch.dtype):
        raise TypeError(f"compute_dtype must be a torch.dtype such as torch.bfloat16, "
                        f"not {compute_dtype!r}")
    if not compute_dtype.is_floating_point:
        raise TypeError(f"compute_dtype must be a floating-point dtype, not {compute_dtype}")
    return compute_dtype


def default_policy(module: nn.Module) -> list[nn.Module]:
    """The GPT's blocks, then every ``nn.Linear``/``nn.Embedding`` outside them."""
    blocks = getattr(module, "blocks", None)
    chosen = list(blocks) if isinstance(blocks, nn.ModuleList) else []
    inside = {id(m) for b in chosen for m in b.modules()}
    chosen += [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Embedding))
               and id(m) not in inside and m is not module]
    return chosen


def resolve_units(module: nn.Module, units=None) -> list[tuple[str, nn.Module]]:
    """``[(qualified name, submodule)]`` in module order; a clear error for bad input."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"FSDP wraps an nn.Module, not {type(module).__name__}")
    names = {id(m): n for n, m in module.named_modules()}
    if units is None:
        chosen = default_policy(module)
    elif callable(units) and not isinstance(units, nn.Module):
        chosen, inside = [], set()
        for m in module.modules():
            if m is not module and id(m) not in inside and units(m):
                chosen.append(m)
                inside.update(id(s) for s in m.modules())
    else:
        chosen = list(units)
        _check_unit_list(module, chosen, names)
    order = {id(m): i for i, m in enumerate(module.modules())}
    chosen = sorted({id(m): m for m in chosen}.values(), key=lambda m: order[id(m)])
    return [(names[id(m)], m) for m in chosen]


def _check_unit_list(module: nn.Module, chosen: list, names: dict) -> None:
    for m in chosen:
        if not isinstance(m, nn.Module) or id(m) not in names:
            raise ValueError(f"unit {type(m).__name__} is not a submodule of the wrapped "
                             f"{type(module).__name__}")
        if m is module:
            raise ValueError("the wrapped module itself cannot be a unit: what lies "
                             "outside every unit stays replicated")
    for m in chosen:
        for other in chosen:
            if other is not m and any(s is m for s in other.modules()):
                raise ValueError(f"unit {names[id(m)]!r} lies inside unit "
                                 f"{names[id(other)]!r}: units must not nest")


def parameter_slots(module: nn.Module) -> dict[nn.Parameter, list[tuple[str, nn.Module, str]]]:
    """Every parameter with each ``(qualified name, module, attribute)`` that holds it."""
    out: dict[nn.Parameter, list] = {}
    for prefix, m in module.named_modules(remove_duplicate=False):
        for attr, p in m._parameters.items():
            if p is not None:
                name = f"{prefix}.{attr}" if prefix else attr
                if all(s[1] is not m or s[2] != attr for s in out.get(p, [])):
                    out.setdefault(p, []).append((name, m, attr))
    return out


def assign_owners(module: nn.Module, units) -> dict[nn.Parameter, int | None]:
    """Each parameter's unit index, or ``None`` (replicated: outside every unit, or tied across)."""
    unit_of = {}
    for i, (_, sub) in enumerate(units):
        for m in sub.modules():
            unit_of.setdefault(id(m), i)
    owners: dict[nn.Parameter, int | None] = {}
    for p, slots in parameter_slots(module).items():
        found = {unit_of.get(id(m)) for _, m, _ in slots}
        owners[p] = found.pop() if len(found) == 1 else None
    return owners


def shard_parameter(p: nn.Parameter, slots, rank: int, world_size: int,
                    compute_dtype: torch.dtype | None) -> ParamSlot:
    """Put this rank's shard of ``p`` in every ``(name, module, attribute)`` that held ``p``."""
    chunk = chunk_size(p.numel(), world_size)
    piece = padded_flat(p.detach(), world_size)[rank * chunk:(rank + 1) * chunk]
    shard = nn.Parameter(piece.clone(), requires_grad=p.requires_grad)
    full = torch.empty(0, dtype=compute_dtype or p.dtype, device=p.device)
    full.requires_grad_(p.requires_grad)
    for _, m, attr in slots:
        m._parameters[attr] = shard              # the module's parameter IS the shard
    return ParamSlot(slots[0][0], [(m, a) for _, m, a in slots], p.shape, chunk, shard, full)
