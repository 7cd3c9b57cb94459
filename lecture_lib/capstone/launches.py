"""The capstone's step on a GPU: launch overhead, CUDA graphs and what ``torch.compile`` fuses.

A small model on a GPU is *launch-bound*: the host (Python and PyTorch's dispatcher) needs
longer to launch each kernel than the kernel runs, so the step lasts about
``kernels x launch_seconds`` (:mod:`lecture_lib.emulate`, appendix A2). Two remedies:
a **CUDA graph** launches the recorded kernels at once (no host cost per kernel), and
**torch.compile** (Ansel et al. 2024, "PyTorch 2") launches fewer kernels: TorchDynamo captures
the model's Python as an FX graph, AOTAutograd derives the backward graph ahead of time, and
inductor, the default compiler, generates one kernel for each group of element-wise operations
and reductions that feed each other (vertical fusion), calling a library kernel for the
matrix products and attention.

:func:`emulated_step` times one training step of the capstone's model under an emulated
cluster (the notebook's table and self-study question 5 use it, on the same batch layout:
:func:`loader_layout_batch`). :func:`capture` records the two graphs ``torch.compile`` hands
its compiler, with a backend that compiles nothing (inductor's C++ kernels take tens of
seconds of CPU to build, more than a notebook in CI may spend), and :func:`count_kernels`
counts them: the operations eager mode launches as kernels, the library kernels among them,
and the groups of connected element-wise operations and reductions. One kernel per library
call and per group is the estimate of what the compiled step launches: inductor may still
split a group (a reduction of another shape) or join two (horizontal fusion), so it is an
estimate, not a count of inductor's kernels.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from .. import emulate
from ..models import GPT, GPTConfig

LIBRARY_KERNELS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product")
"""ATen operations inductor calls as library kernels (BLAS, oneDNN, cuBLAS, flash attention)
rather than generating: each stays one kernel when compiled."""

_FREE = ("empty", "empty_like", "empty_strided", "detach", "alias", "lift_fresh", "_unsafe_view")
"""Operations that launch no kernel (allocations; views are known by their schema), as the
emulation counts them."""


def loader_layout_batch(cfg: GPTConfig, batch: int, seed: int = 0):
    """``(inputs, targets)`` of random tokens laid out as :class:`~.loader.TokenLoader` gives
    them: views of one ``(batch, seq_len + 1)`` tensor, shifted by one (non-contiguous, so the
    loss copies the targets: one kernel more than a contiguous batch)."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(cfg.vocab_size, (batch, cfg.seq_len + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def emulated_step(cfg: GPTConfig, x, y, cluster, lr: float = 2e-3, steps: int = 2) -> dict:
    """The last of ``steps`` forward + backward + AdamW steps of ``GPT(cfg, 0)`` on ``(x, y)``
    in this process, emulated on ``cluster`` (the first step also creates AdamW's state).
    Emulated seconds: ``step``, ``forward + backward``, ``AdamW``; ``host forward + backward``
    (when the host launched the backward's last kernel); ``kernels`` and ``AdamW kernels``
    (the host's time over ``launch_seconds``: the launches, in eager mode)."""
    cluster = emulate.preset(cluster)
    launch = cluster.device.launch_seconds
    model = GPT(cfg, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        with emulate.emulated(cluster) as clock:
            model(x, y).backward()
            backward, host_backward = clock.now(), clock.host
            opt.step()
            host = clock.host
            end = clock.synchronize()
    return {"step": end, "forward + backward": backward, "AdamW": end - backward,
            "host forward + backward": host_backward, "kernels": host / launch,
            "AdamW kernels": (host - host_backward) / launch}


@dataclass
class Captured:
    """The ATen graphs ``torch.compile`` hands its compiler for one forward + backward."""
    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule
    seconds: float          # real seconds to capture them (Dynamo + AOTAutograd) and run once
    compiled: torch.nn.Module   # the model compiled with that backend: runs the graphs as they are


def capture(model: torch.nn.Module, *inputs) -> Captured:
    """Compile ``model`` with a backend that records its forward and backward graphs and
    runs them as they are (no code generated), then run forward and backward once."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=record, bw_compiler=record)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    start = time.perf_counter()
    compiled(*inputs).backward()
    seconds = time.perf_counter() - start
    if len(graphs) != 2:
        raise RuntimeError(f"expected one forward and one backward graph, got {len(graphs)}")
    return Captured(graphs[0], graphs[1], seconds, compiled)


def _kind(node) -> str | None:
    """``"library"``, ``"fusible"`` or None (no kernel: a view, an allocation, not ATen)."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    name = target._schema.name.split("::")[-1]
    if target.is_view or name in _FREE:
        return None
    return "library" if name.startswith(LIBRARY_KERNELS) else "fusible"


def _groups(graph: torch.fx.Graph, kinds: dict) -> int:
    """Connected groups of fusible operations (data edges, through views) in ``graph``."""
    parent = {n: n for n in graph.nodes}

    def root(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in graph.nodes:
        if n.op != "call_function" or kinds.get(n) == "library":
            continue
        for m in n.all_input_nodes:        # a graph input shared by two groups does not join them
            if m.op == "call_function" and kinds.get(m) != "library":
                parent[root(m)] = root(n)
    return len({root(n) for n in graph.nodes if kinds.get(n) == "fusible"})


def count_kernels(captured: Captured) -> dict:
    """Per graph (``forward``, ``backward``) and in ``total``: ``ops`` (the operations eager
    mode launches as kernels), ``library`` (matmuls, attention), ``fusible`` (the rest),
    ``groups`` (connected groups of fusible operations) and ``compiled`` (the estimate of
    the compiled graph's kernels: ``library + groups``)."""
    out = {}
    for name, gm in (("forward", captured.forward), ("backward", captured.backward)):
        kinds = {n: _kind(n) for n in gm.graph.nodes}
        library = sum(k == "library" for k in kinds.values())
        fusible = sum(k == "fusible" for k in kinds.values())
        groups = _groups(gm.graph, kinds)
        out[name] = {"ops": library + fusible, "library": library, "fusible": fusible,
                     "groups": groups, "compiled": library + groups}
    out["total"] = {k: out["forward"][k] + out["backward"][k] for k in out["forward"]}
    return out


def real_ratios(first, second, repeats: int = 5) -> list[float]:
    """``repeats`` ratios of real seconds, ``second() / first()``, each pair run back to back
    (after one warm-up call of each), so that a load on the machine weighs on both alike."""
    first(), second()
    ratios = []
    for _ in range(repeats):
        start = time.perf_counter()
        first()
        middle = time.perf_counter()
        second()
        ratios.append((time.perf_counter() - middle) / (middle - start))
    return ratios
