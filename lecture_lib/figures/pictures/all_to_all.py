"""Tokens moving in expert parallelism's two all-to-alls: dispatch, then combine.

Each of ``p`` ranks routes its own tokens (top-k of the router's softmax), and
rank ``s`` holds experts ``s E/p ... (s+1) E/p - 1`` (GShard, Lepikhin et al.
2020; Switch Transformer, Fedus et al. 2021). The *dispatch* all-to-all sends
every kept token slot to the rank of its expert; the *combine* all-to-all sends
each result back along the same path, reversed. How many rows go from rank r to
rank s is rank r's ``send_splits[s]`` and rank s's ``recv_splits[r]``: the two
must agree before any token moves, which is why the ranks first exchange their
counts.

:func:`dispatch_example` computes a small example with the library's own
router, capacity and dispatch plan (:func:`~lecture_lib.expert_parallel.top_k_route`,
:func:`~lecture_lib.expert_parallel.admit`,
:func:`~lecture_lib.expert_parallel.plan_dispatch`), every rank in this
process: the count table the ranks would all-gather is stacked here instead.
:func:`draw_all_to_all` draws it. No process starts.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from ...expert_parallel import admit, plan_dispatch, top_k_route
from .interleaved import RANK_COLORS


def dispatch_example(p: int = 4, tokens_per_rank: int = 6, num_experts: int = 4, k: int = 1,
                     capacity_factor: float | None = None, d_model: int = 8,
                     seed: int = 0) -> dict:
    """Route ``tokens_per_rank`` random tokens on each of ``p`` ranks with one random router.

    Returns ``expert`` (per rank, (n, k) chosen experts), ``keep`` (per rank, (n, k) kept
    slots), ``send[r][s]`` (rows rank r sends to rank s: its plan's ``send_splits``),
    ``recv[s][r]`` (rows rank s receives from r: its plan's ``recv_splits``) and
    ``experts_of`` (the experts each rank holds).
    """
    if num_experts % p:
        raise ValueError(f"{num_experts} experts do not spread evenly over {p} ranks")
    gen = torch.Generator().manual_seed(seed)
    router = torch.randn(d_model, num_experts, generator=gen) * 3
    x = [torch.randn(tokens_per_rank, d_model, generator=gen) for _ in range(p)]
    routings = [top_k_route(xr @ router, k) for xr in x]
    counts_all = torch.stack([r.counts for r in routings]).tolist()   # what exchange_counts gathers
    per = num_experts // p
    experts_of = [list(range(s * per, (s + 1) * per)) for s in range(p)]
    admitted = [admit(routings[r], counts_all, r, capacity_factor) for r in range(p)]
    plans = [plan_dispatch(routings[r], admitted[r], experts_of[r]) for r in range(p)]
    return {"expert": [r.expert for r in routings], "keep": [a.keep for a in admitted],
            "send": [plan.send_splits for plan in plans],
            "recv": [plan.recv_splits for plan in plans], "experts_of": experts_of}


HALF_WIDTH = {"home": 0.25, "experts": 0.2}
"""Half the width of a rank's box, in axis units: where an arrow starts and ends."""
ALONG = (0.72, 0.6, 0.5, 0.4, 0.3, 0.82)
"""Where a count may sit along its arrow, first choice first (a share of the arrow's length)."""
CLEAR_PX = (22, 16)
"""How far apart two counts' centres must be, across or up, in display pixels."""


def _links(ax, send, p, reverse: bool) -> list[tuple[int, int, int]]:
    """Arrows from rank r (left, its tokens) to rank s (right, its experts) with the row count;
    for combine, from rank s (left, its experts) back to rank r (right, its tokens)."""
    drawn, placed = [], []      # placed: the counts' centres, in display pixels
    to_px = ax.transData.transform
    for r in range(p):
        for s in range(p):
            n = send[r][s]
            if not n:
                continue
            if reverse:
                (y0, w0), (y1, w1) = (-s, HALF_WIDTH["experts"]), (-r, HALF_WIDTH["home"])
            else:
                (y0, w0), (y1, w1) = (-r, HALF_WIDTH["home"]), (-s, HALF_WIDTH["experts"])
            x0, x1 = w0, 1 - w1
            ax.annotate("", (x1, y1), (x0, y0),
                        arrowprops={"arrowstyle": "-|>", "mutation_scale": 12, "shrinkA": 0,
                                    "shrinkB": 0, "lw": 0.6 + 0.6 * n,
                                    "color": RANK_COLORS[r % 8], "alpha": 0.8})
            # the count sits near the arrowhead, slid back along its arrow until it is clear of
            # every count already written (where arrows converge, the labels would overlap)
            for along in ALONG:
                at = (x0 + (x1 - x0) * along, y0 + (y1 - y0) * along)
                px = to_px(at)
                if all(abs(px[0] - q[0]) > CLEAR_PX[0] or abs(px[1] - q[1]) > CLEAR_PX[1]
                       for q in placed):
                    break
            placed.append(px)
            ax.text(*at, str(n), fontsize=8,
                    ha="center", va="center", color=RANK_COLORS[r % 8],
                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none"})
            drawn.append((r, s, n))
    return drawn


def draw_all_to_all(example: dict | None = None):
    """Dispatch (left: tokens' home rank -> expert's rank) and combine (right: back home),
    arrows as thick as the rows they carry, counts written on them. Returns ``(figure,
    drawn)``: ``drawn["dispatch"]``/``["combine"]`` are ``(from_rank, to_rank, rows)``."""
    ex = example or dispatch_example()
    p = len(ex["send"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 1.4 + 0.9 * p))
    drawn = {}
    for ax, phase in zip(axes, ("dispatch", "combine")):
        combine = phase == "combine"
        # combine sends rank s's results back to r: the same matrix, transposed
        ax.set(xlim=(-0.45, 1.45), ylim=(-p + 0.4, 0.6))       # before _links measures pixels
        drawn[phase] = [(s, r, n) if combine else (r, s, n)
                        for r, s, n in _links(ax, ex["send"], p, reverse=combine)]
        for rank in range(p):
            home, experts = (1, 0) if combine else (0, 1)
            chosen = " ".join(str(int(e)) for e in ex["expert"][rank][:, 0])
            ax.text(home, -rank, f"rank {rank}\ntokens -> experts\n{chosen}", ha="center",
                    va="center", fontsize=8, color="white",
                    bbox={"fc": RANK_COLORS[rank % 8], "ec": "none"})
            ax.text(experts, -rank, f"rank {rank}\nexperts {ex['experts_of'][rank]}",
                    ha="center", va="center", fontsize=8, color="white",
                    bbox={"fc": RANK_COLORS[rank % 8], "ec": "none"})
        ax.set(xlim=(-0.45, 1.45), ylim=(-p + 0.4, 0.6), xticks=[], yticks=[])
        ax.set_title("dispatch: each token to its expert's rank" if not combine else
                     "combine: each result back to its token's rank", fontsize=10)
        ax.axis("off")
    fig.tight_layout()
    return fig, drawn
