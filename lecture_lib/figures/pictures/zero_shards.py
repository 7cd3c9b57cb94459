"""Which rank holds which shard of the model states: between steps, and within a ZeRO-3 step.

Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", Figure 1): every tensor is cut into ``p`` shards, one per
data-parallel rank (:mod:`lecture_lib.zero.shards`: rank r owns elements
``[r c, (r + 1) c)``, ``c = ceil(numel / p)``). Plain data parallelism (DDP)
keeps every shard of the parameters, gradients and optimizer states on every
rank; ZeRO-1 keeps only shard r of the optimizer states on rank r, ZeRO-2 also
only shard r of the gradients, ZeRO-3 also only shard r of the parameters.

Which kinds a stage shards is read from the memory model
(:func:`lecture_lib.costmodel.model_state_breakdown`: a kind is sharded when a
rank holds 1/p of it), and each block's element range from
:func:`lecture_lib.zero.shards.shard_bounds`, the cut the sharded optimizer and
the fully sharded model use. :func:`holdings` is the data; :func:`draw_zero_shards`
draws it as a grid rank x {params, grads, optimizer}, one square per shard.

That grid shows what a rank keeps between steps. Within a ZeRO-3 step a unit's
parameters change hands (Zhao et al. 2023, "PyTorch FSDP", figure 2): between uses
rank r holds only its shard (*sharded*); an all-gather *in flight* turns the shards
into the *full* weights, which every rank then holds while the unit is *computing*
and until it is freed. :func:`shard_states` replays the ``events`` a
:class:`~lecture_lib.zero.fsdp.FullyShardedModel` records into each unit's state
after each event; :func:`draw_shard_states` draws them, one row per unit and one
column per moment, with the same squares in the same course colours
(:data:`lecture_lib.figures.plots.COLORS`: parameters in the compute colour, pale
for a shard, dark while computing; the all-gather in the communication colour).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import to_hex, to_rgb
from matplotlib.patches import Patch, Rectangle

from ...costmodel.memory import model_state_breakdown
from ...zero.shards import shard_bounds
from ..plots import COLORS

KINDS = ("params", "grads", "optimizer")
STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
KIND_COLORS = {"params": COLORS["compute"], "grads": COLORS["backward"],
               "optimizer": COLORS["optimizer"]}
MIXED_ADAM = {"param_bytes": 2, "grad_bytes": 2, "optimizer_bytes_per_param": 12}
FP32_ADAM = {"param_bytes": 4, "grad_bytes": 4, "optimizer_bytes_per_param": 8}
# What the picture counts: its label and Adam's bytes per parameter (weights, gradients, state)
ADAM_BYTES = {"mixed": ("mixed-precision Adam, 2 + 2 + 12 per parameter", MIXED_ADAM),
              "fp32": ("fp32 Adam, 4 + 4 + 8 per parameter", FP32_ADAM)}


def _mix(color: str, toward: str, amount: float) -> str:
    """``color`` moved ``amount`` of the way to ``toward`` (white: paler, black: darker)."""
    a, b = to_rgb(color), to_rgb(toward)
    return to_hex([x + (y - x) * amount for x, y in zip(a, b)])


STATES = ("sharded", "in flight", "full", "computing")
STATE_COLORS = {"sharded": _mix(KIND_COLORS["params"], "white", 0.7),
                "in flight": _mix(COLORS["comm"], "white", 0.35),
                "full": KIND_COLORS["params"],
                "computing": _mix(KIND_COLORS["params"], "black", 0.4)}
_AFTER = {"gather": "in flight", "full": "full", "compute": "computing", "done": "full",
          "reduce_scatter": "full", "free": "sharded"}


def _square(ax, x: float, y: float, color: str, filled: bool = True, text: str | None = None):
    """One block of a tensor: filled in its colour when held, outlined when not."""
    ax.add_patch(Rectangle((x, y), 0.9, 0.9, facecolor=color if filled else "white",
                           edgecolor=color, lw=1.0))
    if text is not None:
        ax.text(x + 0.45, y + 0.45, text, ha="center", va="center", fontsize=8, color="white")


def _bare(ax) -> None:
    ax.tick_params(length=0)
    ax.grid(False)
    for side in ax.spines.values():
        side.set_visible(False)


def sharded_kinds(stage: int, world_size: int) -> tuple[str, ...]:
    """The kinds of model state a rank holds 1/world_size of at this stage (memory model)."""
    if world_size < 2:
        return ()
    full = model_state_breakdown(1.0, 1, 0, 1, 1, 1)
    split = model_state_breakdown(1.0, world_size, stage, 1, 1, 1)
    return tuple(k for k in KINDS if split[k] < full[k])


def holdings(stage: int, world_size: int, numel: int) -> dict[int, dict[str, list]]:
    """``{rank: {kind: [(shard, lo, hi), ...]}}``: the shards of a ``numel``-element tensor held."""
    if world_size < 1 or numel < world_size:
        raise ValueError(f"need 1 <= world_size <= numel, not world_size={world_size}, "
                         f"numel={numel}")
    sharded = sharded_kinds(stage, world_size)
    bounds = [shard_bounds(numel, b, world_size)[1:] for b in range(world_size)]
    return {r: {k: [(b, *bounds[b]) for b in ([r] if k in sharded else range(world_size))]
                for k in KINDS}
            for r in range(world_size)}


def bytes_per_rank_in_psi(stage: int, world_size: int, precision: str = "mixed") -> float:
    """Model-state bytes per rank per parameter of Adam in ``precision`` (:data:`ADAM_BYTES`:
    ``"mixed"``, 2 + 2 + 12, or ``"fp32"``, 4 + 4 + 8)."""
    if precision not in ADAM_BYTES:
        raise ValueError(f"precision must be one of {sorted(ADAM_BYTES)}, not {precision!r}")
    return model_state_breakdown(1.0, world_size, stage, **ADAM_BYTES[precision][1])["total"]


def _draw_stage(ax, held: dict, world_size: int) -> int:
    """One panel: rows are ranks, three groups of ``world_size`` squares; returns squares filled."""
    filled = 0
    for r in range(world_size):
        for g, kind in enumerate(KINDS):
            mine = {b for b, _, _ in held[r][kind]}
            for b in range(world_size):
                filled += b in mine
                _square(ax, g * (world_size + 1) + b, r, KIND_COLORS[kind], b in mine,
                        str(b) if b in mine else None)
    width = len(KINDS) * (world_size + 1) - 1
    ax.set_xlim(-0.2, width + 0.1)
    ax.set_ylim(world_size, -0.1)
    centres = [g * (world_size + 1) + world_size / 2 - 0.05 for g in range(len(KINDS))]
    ax.set_xticks(centres, list(KINDS), fontsize=8)
    ax.set_yticks([r + 0.45 for r in range(world_size)], [f"rank {r}" for r in range(world_size)],
                  fontsize=8)
    _bare(ax)
    return filled


def draw_zero_shards(world_size: int = 4, numel: int = 1024, stages=(0, 1, 2, 3),
                     precision: str = "mixed"):
    """The picture between steps: one panel per stage, its bytes those of Adam in
    ``precision`` (``"mixed"`` or ``"fp32"``); returns ``(fig, data)``.

    ``data[stage] = {"holdings": holdings(...), "filled": squares drawn filled,
    "bytes_per_param": model-state bytes per rank per parameter}``. Square ``b`` in
    a rank's group is shard ``b`` of that kind (elements ``shard_bounds(numel, b, p)``),
    filled when the rank holds it.
    """
    label = ADAM_BYTES[precision][0] if precision in ADAM_BYTES else None
    bytes_per_rank_in_psi(0, world_size, precision)          # a clear error for a bad precision
    fig, axes = plt.subplots(1, len(stages), figsize=(3.3 * len(stages), 0.6 * world_size + 1.4),
                             squeeze=False)
    data = {}
    for ax, stage in zip(axes[0], stages):
        held = holdings(stage, world_size, numel)
        per_param = bytes_per_rank_in_psi(stage, world_size, precision)
        data[stage] = {"holdings": held, "filled": _draw_stage(ax, held, world_size),
                       "bytes_per_param": per_param}
        ax.set_title(f"{STAGE_NAMES[stage]}: {per_param:g} Psi bytes per rank", fontsize=9)
    fig.suptitle(f"{label.split(',')[0]} on {world_size} data-parallel ranks: which rank holds "
                 "which shard (square b = shard b, filled = held)", fontsize=10)
    fig.text(0.5, 0.01, f"bytes: {label} (Rajbhandari et al. 2020); Psi = number of parameters",
             ha="center", fontsize=8, color="0.4")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig, data


def shard_states(events, units) -> list[tuple[str, dict[str, str]]]:
    """``[(label, {unit: state})]`` after each event that changes a state (ZeRO-3, one rank)."""
    now = {u: "sharded" for u in units}
    out = []
    for what, unit, phase, *_ in events:
        state = _AFTER.get(what)
        if state is None or unit not in now or now[unit] == state and what != "compute":
            continue
        now[unit] = state
        out.append((f"{what} {unit} ({phase})", dict(now)))
    return out


def draw_shard_states(ax, states, units, world_size: int, title: str | None = None):
    """The picture within a ZeRO-3 step: one square per unit and moment, coloured by its state."""
    for j, (_, state) in enumerate(states):
        for i, unit in enumerate(units):
            _square(ax, j, i, STATE_COLORS[state[unit]])
    ax.set_xlim(-0.1, len(states))
    ax.set_ylim(len(units), -0.1)
    ax.set_yticks([i + 0.45 for i in range(len(units))], units)
    ax.set_xlabel("moment (one column per gather / compute / free event, in order)")
    ax.set_ylabel("unit")
    _bare(ax)
    labels = {"sharded": f"sharded: rank r holds its 1/{world_size}",
              "in flight": "all-gather in flight", "full": f"full: all {world_size} ranks",
              "computing": "computing (full)"}
    handles = [Patch(color=STATE_COLORS[s], label=labels[s]) for s in STATES]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    return ax


__all__ = ["KINDS", "STAGE_NAMES", "STATES", "STATE_COLORS", "bytes_per_rank_in_psi",
           "draw_shard_states", "draw_zero_shards", "holdings", "shard_states", "sharded_kinds"]
