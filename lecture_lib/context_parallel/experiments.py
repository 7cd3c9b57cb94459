"""What the context-parallelism notebook and tests run and measure.

* :func:`compare_attention`: ring and Ulysses attention on ``cp`` ranks against
  one process (outputs and gradients), with the bytes each rank sent;
* :func:`train_context_parallel`: the GPT trained with its sequence split over
  ``cp`` ranks, the result comparable with ``models.train_reference``;
* :func:`measure_attention_flops`: per-rank attention FLOPs counted by
  ``torch.utils.flop_counter`` on the operations the ring really ran;
* :func:`measure_activation_memory`: bytes autograd saves per device for one
  block, against sequence length, one process and under cp;
* :func:`measure_ring_overlap`: ring attention in emulated time (:mod:`lecture_lib.emulate`):
  each rank's compute and K/V hops, its step, and the step of the same ring
  run with every exchange waited for before the block is computed
  (:func:`exchanges_waited`), so nothing overlaps;
* :func:`compare_with_torch`: PyTorch's own context parallel, if it runs here.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from .. import emulate
from ..comm import record_comm, resolve
from ..metrics import saved_tensor_bytes
from ..models import GPT, GPTConfig, MarkovText, TrainResult, make_optimizer
from ..progress import progress
from ..runtime import launch
from . import ring
from .attention import attention_reference, check_kernel
from .layout import check_layout, shard_sequence, unshard_sequence
from .model import (
    check_context_parallel,
    make_attention,
    parallelize_gpt,
    sync_context_parallel_grads,
)
from .ulysses import check_ulysses

MOVES = ("send", "all_to_all")              # how ring and Ulysses move K/V (and q, o)
CASES = [(m, lay, c) for m in ("ring", "ulysses") for lay in ("contiguous", "zigzag")
         for c in (True, False)]


def _inputs(shape, seed, kv_heads: int | None = None):
    """q, k, v and d(out) of ``shape`` (batch, heads, tokens, head_dim); k and v with
    ``kv_heads`` heads (grouped-query attention) when given."""
    g = torch.Generator().manual_seed(seed)
    kv = shape if kv_heads is None else (shape[0], kv_heads, *shape[2:])
    return [torch.randn(s, generator=g) for s in (shape, kv, kv, shape)]


def attention_on_rank(shape, cases, seed: int = 0, group=None, kv_heads: int | None = None,
                      kernel: str = "blockwise") -> list[dict]:
    """Inside a rank: each case's output and q/k/v gradients (this rank's slice), bytes sent."""
    _, rank, cp = resolve(group)
    q, k, v, do = _inputs(shape, seed, kv_heads)
    out = []
    for method, layout, causal in cases:
        mine = [shard_sequence(t, rank, cp, layout, dim=2).to(launch.device()) for t in (q, k, v)]
        for t in mine:
            t.requires_grad_(True)
        attend = make_attention(method, group, layout, causal, kernel)
        with record_comm() as forward:
            o = attend(*mine)
        with record_comm() as backward:
            o.backward(shard_sequence(do, rank, cp, layout, dim=2).to(o.device))
        logs = {"forward": forward, "backward": backward}      # the K/V moves, not the check
        out.append({"o": o.detach(), "grads": [t.grad for t in mine],
                    "sent": {ph: sum(log.sent_bytes(kind=k) for k in MOVES)
                             for ph, log in logs.items()},
                    "messages": {ph: sum(log.calls(kind=k) for k in MOVES)
                                 for ph, log in logs.items()}})
    return out


def compare_attention(cp: int, cases=CASES, shape=(2, 4, 32, 8), seed: int = 0,
                      timeout: float = 120, kv_heads: int | None = None,
                      kernel: str = "blockwise") -> list[dict]:
    """Each case on ``cp`` ranks against one process: max abs errors, bytes per rank.
    ``kv_heads``: k and v with fewer heads (grouped-query attention); ``kernel``: the ring's
    block kernel (:data:`.attention.KERNELS`)."""
    for method, layout, _ in cases:
        check_layout(shape[2], cp, layout)
        if method == "ulysses":
            check_ulysses(shape[1], cp, kv_heads)
    check_kernel(kernel)
    results = launch.run(attention_on_rank, cp, shape, list(cases), seed, None, kv_heads, kernel,
                         timeout=timeout)
    q, k, v, do = _inputs(shape, seed, kv_heads)
    for t in (q, k, v):
        t.requires_grad_(True)
    report = []
    for i, (method, layout, causal) in enumerate(cases):
        ref = attention_reference(q, k, v, causal)
        ref_grads = torch.autograd.grad(ref, (q, k, v), do)
        got = unshard_sequence([r[i]["o"] for r in results], layout, dim=2)
        got_grads = [unshard_sequence([r[i]["grads"][j] for r in results], layout, dim=2)
                     for j in range(3)]
        pairs = [(got, ref.detach())] + list(zip(got_grads, ref_grads))
        report.append({"method": method, "layout": layout, "causal": causal, "cp": cp,
                       "max_abs_err": max((a - b).abs().max().item() for a, b in pairs),
                       "close": all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in pairs),
                       "sent_bytes": results[0][i]["sent"],
                       "messages": results[0][i]["messages"]})
    return report


def train_on_rank(cfg: GPTConfig, batch_size: int, steps: int, lr: float, optimizer: str,
                  layout: str, method: str, seed: int, data_seed: int) -> dict:
    """Inside a rank: train the GPT on this rank's slice of every sequence."""
    _, rank, cp = resolve(None)
    model = parallelize_gpt(GPT(cfg, seed).to(launch.device()), None, layout, method)
    opt = make_optimizer(model.parameters(), optimizer, lr)
    data, losses = MarkovText(cfg.vocab_size, cfg.seq_len, data_seed), []
    for step in range(steps):
        x, y = (shard_sequence(t, rank, cp, layout).to(launch.device())
                for t in data.batch(step, batch_size))
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)                       # the mean over this rank's tokens
        loss.backward()
        sync_context_parallel_grads(model)       # average over cp: the mean over all tokens
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / cp)
    return {"losses": losses,
            "params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()}}


def train_context_parallel(cfg: GPTConfig, cp: int, batch_size: int, steps: int,
                           lr: float = 1e-2, optimizer: str = "adamw", layout: str = "zigzag",
                           method: str = "ring", seed: int = 0, data_seed: int = 0,
                           timeout: float = 180) -> TrainResult:
    """Train on ``cp`` ranks; rank 0's result (every cp rank holds the same weights)."""
    check_context_parallel(cfg, cp, layout, method)
    if optimizer not in ("adamw", "sgd"):                      # make_optimizer's names
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', not {optimizer!r}")
    results = launch.run(train_on_rank, cp, cfg, batch_size, steps, lr, optimizer, layout,
                         method, seed, data_seed, timeout=timeout)
    return TrainResult(results[0]["losses"], results[0]["params"])


def _flops_on_rank(shape, layouts, causal: bool) -> dict:
    _, rank, cp = resolve(None)
    q, k, v, _ = _inputs(shape, 0)
    out = {}
    for layout in layouts:
        mine = [shard_sequence(t, rank, cp, layout, dim=2).to(launch.device()) for t in (q, k, v)]
        with FlopCounterMode(display=False) as counter:
            ring.RingAttention(None, layout, causal)(*mine)
        out[layout] = counter.get_total_flops()
    return out


def measure_attention_flops(cp: int, shape=(1, 4, 64, 16), causal: bool = True,
                            layouts=("contiguous", "zigzag"), timeout: float = 120) -> dict:
    """``{layout: [forward attention FLOPs of rank r]}``, counted on the ops the ring ran."""
    for layout in layouts:
        check_layout(shape[2], cp, layout)
    results = launch.run(_flops_on_rank, cp, shape, tuple(layouts), causal, timeout=timeout)
    return {layout: [r[layout] for r in results] for layout in layouts}


def _memory_on_rank(cfg: GPTConfig, batch_size: int, layout: str, group=None) -> int:
    _, rank, cp = resolve(group)
    model = parallelize_gpt(GPT(cfg, 0).to(launch.device()), group, layout, "ring")
    block = model.blocks[0]
    g = torch.Generator().manual_seed(1)
    x = shard_sequence(torch.randn(batch_size, cfg.seq_len, cfg.d_model, generator=g),
                       rank, cp, layout).to(launch.device()).requires_grad_(True)
    with saved_tensor_bytes() as saved:
        block(x)
    return saved.activation_bytes(block)


def measure_activation_memory(seq_lens, cp: int, batch_size: int = 1, d_model: int = 32,
                              n_heads: int = 4, layout: str = "zigzag",
                              timeout: float = 120) -> dict:
    """``{seq_len: (one-process bytes, per-device bytes under cp)}`` saved by one block."""
    out = {}
    for s in progress(list(seq_lens), f"activation memory: one sequence length on {cp} ranks "
                      "each"):
        cfg = GPTConfig(vocab_size=32, seq_len=s, d_model=d_model, n_heads=n_heads, n_layers=1)
        check_context_parallel(cfg, cp, layout)
        one = _memory_on_rank(cfg, batch_size, layout, group="local")
        per_device = launch.run(_memory_on_rank, cp, cfg, batch_size, layout, timeout=timeout)
        out[s] = (one, max(per_device))
    return out


@contextmanager
def exchanges_waited():
    """Within the block, the ring waits for each exchange as soon as it posts it.

    The comparison for :func:`measure_ring_overlap`: the same messages and the
    same arithmetic in the same order (results are identical), but the K/V hop
    has arrived before the block held is computed, so nothing overlaps.
    """
    posted = ring.ring_shift

    def waited(t, group=None):
        received = posted(t, group)()
        return lambda: received
    ring.ring_shift = waited
    try:
        yield
    finally:
        ring.ring_shift = posted


def _emulated_ring(mine, do, layout, causal, backward, preset, overlap: bool) -> dict:
    """One emulated ring attention (forward, and backward), from fresh clocks."""
    mine = [t.detach().clone().requires_grad_(True) for t in mine]
    attend = ring.RingAttention(None, layout, causal)
    attend.check(*(t.shape for t in mine), mine[0].device)   # its all-gather: before the clocks
    with nullcontext() if overlap else exchanges_waited(), emulate.emulated(preset) as clock:
        with clock.phase("forward"):
            o = attend(*mine)
        if backward:
            with clock.phase("backward"):
                o.backward(do)
        step = clock.synchronize()
    spans = clock.timeline()
    hops = [s for s in spans["comm"] if s[3].startswith("send")]
    return {"step_s": step, "spans": spans["compute"] + hops,
            "compute_s": sum(e - s for k, s, e, _ in spans["compute"] if k != "idle"),
            "comm_s": sum(e - s for _, s, e, _ in hops), "hops": len(hops),
            "idle_s": clock.totals.get("idle", 0.0),
            "o": o.detach(), "grads": [t.grad for t in mine] if backward else []}


def _overlap_on_rank(shape, layout, causal, backward, preset, seed) -> dict:
    _, rank, cp = resolve(None)
    q, k, v, do = (shard_sequence(t, rank, cp, layout, dim=2).to(launch.device())
                   for t in _inputs(shape, seed))
    return {"overlapped": _emulated_ring((q, k, v), do, layout, causal, backward, preset, True),
            "serial": _emulated_ring((q, k, v), do, layout, causal, backward, preset, False)}


def measure_ring_overlap(cp: int, shape=(1, 8, 1024, 64), preset="h100-node",
                         layout: str = "zigzag", causal: bool = True, backward: bool = True,
                         seed: int = 0, timeout: float = 120) -> dict:
    """Ring attention on ``cp`` ranks of the emulated ``preset`` (emulated seconds).

    ``shape`` is (batch, heads, tokens, head_dim) of the whole sequence. Returns
    ``{"overlapped": [...], "serial": [...]}``, one dict per rank: ``step_s``,
    ``compute_s`` (busy compute), ``comm_s`` (the K/V and dK/dV hops on its link),
    ``idle_s`` (compute waiting for a hop), ``hops``, ``spans`` (the timeline:
    compute spans and sends), ``o`` and ``grads``; and ``step_s``, ``serial_s``
    (the slowest rank's), ``overlap_s`` (their difference: the hop time hidden).
    The ring's check of the slices (:meth:`.ring.RingAttention.check`, one small
    all-gather) runs before the clocks start: what is timed is the ring itself.
    """
    check_layout(shape[2], cp, layout)
    emulate.preset(preset)                                   # a bad preset: now
    results = launch.run(_overlap_on_rank, cp, shape, layout, causal, backward, preset, seed,
                         timeout=timeout)
    out = {key: [r[key] for r in results] for key in ("overlapped", "serial")}
    out["step_s"] = max(r["step_s"] for r in out["overlapped"])
    out["serial_s"] = max(r["step_s"] for r in out["serial"])
    out["overlap_s"] = out["serial_s"] - out["step_s"]
    return out


def _torch_cp_on_rank(shape, seed: int) -> dict:
    """Inside a rank: torch's ``context_parallel`` on SDPA against one process."""
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415  (DTensor: slow import, this baseline only)
    from torch.distributed.tensor.experimental import context_parallel  # noqa: PLC0415  (same)
    q, k, v, _ = _inputs(shape, seed)
    ref = attention_reference(q, k, v, True)
    mesh = init_device_mesh(launch.device().type, (dist.get_world_size(),))
    buffers = [t.clone().to(launch.device()) for t in (q, k, v, ref)]
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2, 2]):
            out = F.scaled_dot_product_attention(*buffers[:3], is_causal=True)
        err = (out - buffers[3]).abs().max().item()                # torch shards its own way
        return {"ran": True, "max_abs_err": err, "error": ""}
    except (NotImplementedError, RuntimeError) as e:
        return {"ran": False, "max_abs_err": None, "error": f"{type(e).__name__}: {e}"}


def compare_with_torch(cp: int = 2, shape=(1, 4, 32, 8), seed: int = 0,
                       timeout: float = 120) -> list[dict]:
    """PyTorch's own context parallel (``torch.distributed.tensor.experimental``) on ``cp``
    ranks: per rank, whether it ran, its max abs error against one process, or the error."""
    check_layout(shape[2], cp, "zigzag")
    return launch.run(_torch_cp_on_rank, cp, shape, seed, timeout=timeout)
