"""The MoE layer on emulated GPUs, at real size in the dry run.

:func:`time_at_scale` runs :func:`.experiments.layer_pass`, the rank function
every timing of this package runs (one MoE layer's forward and backward), on
``ep`` emulated GPUs on fake tensors (:mod:`lecture_lib.emulate`): charged as
on the GPU, computed nowhere. The dry run has no values, so the routing is
decided before the step (:class:`~.router.FixedRouting`: balanced, or drawn
from a seed with a skew), which fixes every split size. The default is
Mixtral 8x7B's MoE layer (Jiang et al. 2024, arXiv 2401.04088): ``h = 4096``,
8 experts, top-2, SwiGLU experts of ``d_ff = 14336`` (Mistral 7B's MLP, the
same shape as Llama 3 8B's), in bf16, 8192 tokens per GPU (two sequences of 4096).

Each rank keeps its own tokens (ep carved out of data parallelism), so the
experts' work per rank stays the same at every ep while the all-to-all sends
``(ep - 1) / ep`` of its rows away; an ep group larger than a node runs its
all-to-all over InfiniBand instead of NVLink (``gpus_per_node``).
"""
from __future__ import annotations

import math
import time

import torch

from ..emulate import preset as make_preset
from ..emulate import run as emulated_run
from ..models import GPTConfig, real_size
from .experiments import layer_pass
from .router import MoEConfig, check_moe

#: Mistral 7B's block (arXiv 2310.06825, Table 1): Llama 3 8B's shape, a 32000-token vocabulary
MIXTRAL_8X7B = real_size("Llama 3 8B", vocab_size=32000, seq_len=4096)
#: Mixtral's routing: 8 experts, top-2, dropless (no capacity factor)
MIXTRAL_MOE = MoEConfig(num_experts=8, k=2, capacity_factor=None)


def time_at_scale(ep: int = 8, cfg: GPTConfig = MIXTRAL_8X7B, moe: MoEConfig = MIXTRAL_MOE,
                  tokens_per_rank: int = 8192, routing: dict | None = None,
                  preset: str = "h100-node", gpus_per_node: int | None = None,
                  dtype: torch.dtype = torch.bfloat16, timeout: float = 180) -> dict:
    """One MoE layer's forward and backward on ``ep`` emulated GPUs, in the dry run.

    ``routing``: the keywords of :func:`~.router.draw_choices` (``{"seed": 0, "skew":
    1.0}``); ``None`` is balanced. ``gpus_per_node`` changes the preset's node size.
    Returns plain data: ``step`` (emulated seconds, the slowest rank), and per rank
    ``ranks[r]`` with its ``compute``, ``exposed`` (its compute stream waiting on
    communication, or on a slower rank), ``all_to_all`` and ``counts`` seconds (transfers),
    ``sent_bytes`` (all-to-all bytes to other ranks) and ``experts`` (its forward experts
    phase); ``all_to_all_share`` of the step; ``dropped_fraction``; ``timeline[r]``
    (kind, start, end, what) from the step's start; ``wall_seconds``; and what varied.
    """
    check_moe(moe.num_experts, moe.k, moe.capacity_factor, ep)
    if isinstance(tokens_per_rank, bool) or not isinstance(tokens_per_rank, int) or \
            tokens_per_rank < 1:
        raise ValueError(f"tokens_per_rank must be a whole number >= 1, not {tokens_per_rank!r}")
    changes = {} if gpus_per_node is None else {"gpus_per_node": gpus_per_node}
    cluster = make_preset(preset, **changes)
    began = time.perf_counter()
    results = emulated_run(layer_pass, ep, cfg, moe, tokens_per_rank,
                           routing if routing is not None else {}, True, 1, 0, dtype,
                           preset=cluster, dry_run=True, timeout=timeout)
    wall = time.perf_counter() - began
    ranks = [rank_split(r.result, r.clock) for r in results]
    step = max(r["step"] for r in ranks)
    nodes = math.ceil(ep / cluster.gpus_per_node)
    return {"step": step, "ranks": ranks,
            "all_to_all_share": max(r["all_to_all"] for r in ranks) / step,
            "dropped_fraction": results[0].result["stats"]["dropped_fraction"],
            "timeline": [r.pop("timeline") for r in ranks], "wall_seconds": wall,
            "ep": ep, "nodes": nodes, "link": "InfiniBand" if nodes > 1 else "NVLink",
            "preset": cluster.label(), "gpus_per_node": cluster.gpus_per_node,
            "d_model": cfg.d_model, "d_ff": cfg.d_ff, "mlp": cfg.mlp,
            "num_experts": moe.num_experts, "k": moe.k, "capacity_factor": moe.capacity_factor,
            "tokens_per_rank": tokens_per_rank, "routing": routing or "balanced",
            "dtype": str(dtype).removeprefix("torch.")}


def rank_split(passed: dict, clock) -> dict:
    """One rank's emulated step, from :func:`~.experiments.layer_pass`'s result and its
    clock: the compute stream busy (``compute``) or waiting (``exposed``), and each
    collective's transfer seconds (spans ``(kind, start, end, what)``)."""
    start, end = passed["step"]
    mine = [(kind, max(s, start) - start, min(e, end) - start, what)     # clipped to the step
            for kind, s, e, what in clock.spans if e > start and s < end]

    def seconds(kind, what=None):
        return sum(e - s for k, s, e, w in mine if k == kind and what in (None, w))

    busy = sum(e - s for k, s, e, _ in mine if k not in ("comm", "idle"))
    return {"step": end - start, "compute": busy, "exposed": seconds("idle"),
            "all_to_all": seconds("comm", "all_to_all"), "counts": seconds("comm", "all_gather"),
            "sent_bytes": clock.bytes_by_kind.get("all_to_all", 0),
            "experts": passed["seconds"]["experts"], "timeline": mine}
