"""Step time of 3-D parallel training: compute, bubble, and communication on a two-tier network.

A training step on ``dp x tp x pp`` devices, with the global batch cut into
``m`` micro-batches per pipeline (1F1B), costs (Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", sections 3.1-3.3):

* **compute**: ``(6 N + 12 L h s) * tokens`` FLOPs for forward + backward (6 per
  parameter per token, plus attention scores: :func:`.flops.model_flops_per_token`),
  a third more with full recomputation (the forward runs twice), spread over
  all devices and run at ``peak_flops * efficiency``, plus a fixed
  ``layer_overhead`` per layer and micro-batch (launch and framework costs);
* **pipeline bubble**: compute stretched by ``(m + p - 1) / m``
  (:func:`lecture_lib.costmodel.pipeline_bubble`);
* **tensor parallel**: 4 all-reduces of a micro-batch's activations
  ``b s h`` (2 bytes each) per layer and micro-batch (2 forward, 2 backward;
  6 with full recomputation), on the critical path; and per micro-batch the
  vocabulary-parallel ends (Shoeybi et al. 2019, section 3): the token embedding's
  all-reduce on the first stage, the head's (in backward) and the loss's three of
  one fp32 value per token on the last (:func:`vocabulary_all_reduces`);
* **pipeline sends**: one activation forward and one gradient back per
  micro-batch and stage boundary;
* **data parallel**: one all-reduce of this device's gradients (2 bytes per
  parameter) per step, or reduce-scatter + all-gather under ZeRO-1 (the same
  volume); it overlaps with the last micro-batch's backward (or, with
  ``dp_overlap=False``, follows the pipeline as in :mod:`lecture_lib.hybrid`).
  ZeRO-2 and ZeRO-3 keep only a gradient shard, so under gradient accumulation
  they reduce-scatter every micro-batch's gradients (``m`` reduce-scatters per
  step, as DeepSpeed's stage 2 does), each overlapping its own micro-batch's
  backward. ZeRO-2 then all-gathers the parameters once. ZeRO-3 keeps only a
  parameter shard too, so every micro-batch all-gathers the parameters for its
  forward and again for its backward (1.5x ZeRO-1's volume at ``m = 1``, the ZeRO
  paper, section 7; ``m`` times that at ``m`` micro-batches);
* **memory-bound work**, only when the cluster states a ``memory_bandwidth``: the
  element-wise operations of each layer (stretched by the bubble like the compute),
  the optimizer update and the flat gradient buffer, at that bandwidth
  (:mod:`lecture_lib.costmodel.traffic`). Large models on GPUs are dominated by
  FLOPs, and the default (infinite bandwidth) leaves these out.

Every collective is timed with the alpha-beta model of
:mod:`lecture_lib.costmodel.comm` over the link its group really uses: ranks
are laid out with one axis fastest (``inner``), so a group whose ranks fit
in one node rides NVLink, and any group spanning nodes is limited by the
inter-node link (a ring is as fast as its slowest hop).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..dims import ParallelDims, Recipe
from .comm import INFINIBAND_HDR, INFINIBAND_NDR, NVLINK_A100, NVLINK_H100, Link, collective_time
from .flops import model_flops_per_token
from .memory import TransformerShape
from .pipeline import pipeline_bubble
from .traffic import check_optimizer, memory_bound_seconds

AXES = ("dp", "pp", "tp")
RECOMPUTE_FLOPS = {"none": 1.0, "selective": 1.0, "full": 4 / 3}


@dataclass(frozen=True)
class Assumptions:
    """Two things the step model takes as given, as parameters; the defaults are the course's.

    ``selective_extra``: the FLOPs selective recomputation adds, as a share of a step's
    (default 0: free; :func:`selective_recompute_share` gives what it recomputes).
    ``dp_exposed_share``: the share of the data-parallel collectives that nothing hides, a
    floor on their exposed time (default 0: backward hides what it can).
    """
    selective_extra: float = 0.0
    dp_exposed_share: float = 0.0

    def __post_init__(self):
        if not 0 <= self.selective_extra <= RECOMPUTE_FLOPS["full"] - 1:
            raise ValueError(f"selective_extra must lie in [0, 1/3] (full recomputation adds "
                             f"a third), not {self.selective_extra!r}")
        if not 0 <= self.dp_exposed_share <= 1:
            raise ValueError(f"dp_exposed_share must lie in [0, 1], not {self.dp_exposed_share!r}")


ASSUMED = Assumptions()


def selective_recompute_share(shape: TransformerShape) -> float:
    """The FLOPs selective recomputation adds to a step: core attention's forward
    (Korthikanti et al. 2022 recompute it), 4 b s^2 h per layer, over a layer's training
    FLOPs, 3 (24 b s h^2 + 4 b s^2 h) (Narayanan et al. 2021): s / (18 h + 3 s)."""
    s, h = shape.seq_len, shape.hidden
    return s / (18 * h + 3 * s)


@dataclass(frozen=True)
class Cluster:
    """Devices in nodes: a compute rate, a memory size, and the two tiers of links."""
    name: str
    nodes: int
    gpus_per_node: int
    peak_flops: float             # dense 16-bit FLOP/s of one device
    memory_bytes: float
    intra: Link
    inter: Link
    efficiency: float = 0.5       # achieved share of peak on the matrix multiplies
    layer_overhead: float = 0.0   # seconds of fixed cost per layer, micro-batch and pass
                                  # (kernel launches, Python): negligible on big GPU models,
                                  # dominant for the small GPT on a CPU
    memory_bandwidth: float = float("inf")   # bytes/s of device memory; inf: not modelled

    @property
    def devices(self) -> int:
        return self.nodes * self.gpus_per_node


# A100 80GB: 312 TFLOP/s bf16 dense (NVIDIA A100 datasheet); the 1024-GPU cluster of the
# Megatron-LM GPT-3 175B estimate (Narayanan et al. 2021, section 5.1: 140 TFLOP/s per GPU,
# 45% of peak, bubble and communication included; the matrix multiplies alone run nearer 50%;
# tp 8 x pp 16 on 128 nodes in Megatron-LM's examples/pretrain_gpt3_175B.sh).
A100_CLUSTER = Cluster("128 nodes x 8 A100 80GB (Megatron-LM 2021)", 128, 8, 312e12, 80e9,
                       NVLINK_A100, INFINIBAND_HDR, efficiency=0.5)
# H100 SXM: 989 TFLOP/s bf16 dense (NVIDIA H100 datasheet).
H100_CLUSTER = Cluster("128 nodes x 8 H100 80GB", 128, 8, 989e12, 80e9,
                       NVLINK_H100, INFINIBAND_NDR, efficiency=0.4)


@dataclass(frozen=True)
class Parallelism:
    """A run as the model sees it: the layout (:class:`~lecture_lib.dims.ParallelDims`: dp,
    tp, pp), the recipe (:class:`~lecture_lib.dims.Recipe`: a micro-batch's size, the ZeRO
    stage), recomputation, the axis placed inside a node first, and whether the gradient
    all-reduce overlaps with the last backward."""
    dims: ParallelDims
    recipe: Recipe = Recipe()
    recompute: str = "none"
    inner: str = "tp"             # the axis whose ranks are adjacent (inside a node first)
    dp_overlap: bool = True       # the gradient all-reduce hides behind the last backward

    def __post_init__(self):
        if not isinstance(self.dims, ParallelDims):
            raise TypeError(f"dims must be a ParallelDims, not {type(self.dims).__name__}")
        if not isinstance(self.recipe, Recipe):
            raise TypeError(f"recipe must be a Recipe, not {type(self.recipe).__name__}")
        if self.dims.cp != 1 or self.dims.ep != 1:
            raise ValueError(f"step_time models dp x tp x pp (cp and ep are 1), not "
                             f"{self.dims.label()}: see plan_context_parallel for cp")
        if not isinstance(self.dp_overlap, bool):
            raise TypeError(f"dp_overlap must be True or False, not {self.dp_overlap!r}")
        if self.inner not in AXES:
            raise ValueError(f"inner must be one of {AXES}, not {self.inner!r}")
        if self.recompute not in RECOMPUTE_FLOPS:
            raise ValueError(f"recompute must be one of {list(RECOMPUTE_FLOPS)}")

    @property
    def devices(self) -> int:
        return self.dims.world_size

    def order(self) -> tuple[str, ...]:
        """Axes from slowest to fastest: ``inner`` last, the others in dp, pp, tp order."""
        return tuple(a for a in AXES if a != self.inner) + (self.inner,)

    def label(self, dims: ParallelDims | None = None) -> str:
        """``dp8 tp8 pp16 cp1 mb1 zero1 rc:full inner:tp``; ``dims``: other degrees to show
        (the cp or ep that a plan of one cp or ep group stands for)."""
        parts = [(dims or self.dims).label(), self.recipe.label(), f"rc:{self.recompute}",
                 f"inner:{self.inner}"]
        return " ".join(p for p in parts if p)


def group_link(par: Parallelism, axis: str, cluster: Cluster) -> Link | None:
    """The link a group along ``axis`` is limited by (None for a group of one)."""
    size = getattr(par.dims, axis)
    if size == 1:
        return None
    order = par.order()
    stride = 1
    for a in order[order.index(axis) + 1:]:
        stride *= getattr(par.dims, a)
    return cluster.intra if stride * size <= cluster.gpus_per_node else cluster.inter


def training_flops(shape: TransformerShape, tokens: float, recompute: str = "none") -> float:
    """FLOPs of forward + backward over ``tokens`` tokens (recomputation included)."""
    per_token = model_flops_per_token(shape.matmul_params, shape.layers, shape.seq_len,
                                      shape.hidden)
    return per_token * tokens * RECOMPUTE_FLOPS[recompute]


@dataclass
class StepTime:
    compute: float
    bubble: float
    tp_comm: float
    pp_comm: float
    dp_comm: float               # exposed (not hidden behind backward)
    microbatches: int
    details: dict = field(default_factory=dict)
    memory: float = 0.0          # memory-bound work (element-wise, optimizer, grad buffer)

    @property
    def total(self) -> float:
        return self.compute + self.bubble + self.tp_comm + self.pp_comm + self.dp_comm \
            + self.memory

    def parts(self) -> dict:
        """Seconds by part; "memory-bound ops" only where the cluster models memory."""
        parts = {"compute": self.compute, "pipeline bubble": self.bubble,
                 "tensor-parallel comm": self.tp_comm, "pipeline comm": self.pp_comm,
                 "data-parallel comm (exposed)": self.dp_comm}
        if self.memory:
            parts["memory-bound ops"] = self.memory
        return parts


def microbatches(global_batch: int, par: Parallelism) -> int:
    """Micro-batches per pipeline per step; a clear error when the batch does not divide."""
    return par.recipe.split(global_batch, par.dims.dp)[0]


def gradient_reductions(par: Parallelism, microbatches: int = 1) -> int:
    """Gradient reductions per step: one under ZeRO-0/1 (full gradients accumulate),
    one per micro-batch under ZeRO-2/3 (only the shard is kept, so each micro-batch's
    gradients are reduce-scattered before the next one's arrive)."""
    return microbatches if par.recipe.zero_stage >= 2 else 1


def grad_sync_bytes(num_params: float, value_bytes: int, par: Parallelism,
                    microbatches: int = 1) -> float:
    """Bytes of gradients one device hands to its reductions per step:
    ``value_bytes`` for each of its ``num_params / (tp pp)`` parameters, times
    :func:`gradient_reductions`."""
    d = par.dims
    return gradient_reductions(par, microbatches) * value_bytes * num_params / (d.tp * d.pp)


def _dp_collectives(num_params, value_bytes, par, ranks, link):
    """(the collectives of every micro-batch, those once per step) in seconds: ZeRO-0/1 one
    all-reduce per step; ZeRO-2 a reduce-scatter per micro-batch and one all-gather per
    step; ZeRO-3 per micro-batch a reduce-scatter and two all-gathers (forward, backward)."""
    d = par.dims
    nbytes = value_bytes * num_params / (d.tp * d.pp)
    if par.recipe.zero_stage < 2:
        return 0.0, collective_time("all_reduce", nbytes, ranks, link)
    rs = collective_time("reduce_scatter", nbytes, ranks, link)
    gather = collective_time("all_gather", nbytes, ranks, link)
    return (rs + 2 * gather, 0.0) if par.recipe.zero_stage == 3 else (rs, gather)


def grad_sync_seconds(num_params: float, value_bytes: int, par: Parallelism, ranks: int,
                      link: Link | None, microbatches: int = 1) -> float:
    """The data-parallel gradient sync of one device over ``ranks`` ranks, in seconds per step.

    The device holds ``1/(tp pp)`` of ``num_params``, ``value_bytes`` each. ZeRO-0/1:
    one all-reduce per step. ZeRO-2: a reduce-scatter per micro-batch, then one
    all-gather of the parameters. ZeRO-3: per micro-batch a reduce-scatter and two
    all-gathers (1.5x ZeRO-1 at one micro-batch, Rajbhandari et al. 2020). Zero on one
    rank or without a link.
    """
    if ranks == 1 or link is None:
        return 0.0
    each, after = _dp_collectives(num_params, value_bytes, par, ranks, link)
    return gradient_reductions(par, microbatches) * each + after


def grad_sync_exposed(num_params: float, value_bytes: int, par: Parallelism, ranks: int,
                      link: Link | None, microbatches: int, microbatch_compute: float,
                      also: tuple = ()) -> float:
    """What of :func:`grad_sync_seconds` the backward passes leave exposed: the last
    micro-batch's backward hides the final sync; under ZeRO-2/3 each earlier
    micro-batch's collectives hide behind its own backward (2/3 of its compute).
    ``also``: more ``(num_params, ranks)`` groups synced alongside (MoE's experts)."""
    each = after = 0.0
    for n, r in ((num_params, ranks), *also):
        if r > 1 and link is not None:
            a, b = _dp_collectives(n, value_bytes, par, r, link)
            each, after = each + a, after + b
    hidden = microbatch_compute * 2 / 3
    earlier = (gradient_reductions(par, microbatches) - 1) * max(0.0, each - hidden)
    return earlier + exposed_after_backward(each + after, microbatch_compute)


def exposed_after_backward(total: float, microbatch_compute: float) -> float:
    """What of a gradient sync the last micro-batch's backward (2/3 of its compute) leaves."""
    return max(0.0, total - microbatch_compute * 2 / 3)


def vocabulary_all_reduces(act_bytes: float, tokens: int, tp: int, pp: int,
                           link: Link) -> float:
    """Seconds per micro-batch of the all-reduces at the two ends of a vocabulary-parallel
    model, on the stage that has the most (the last; with ``pp = 1`` the only one):
    the token embedding's (first stage, forward), the head's input gradient (last stage,
    backward), and the loss's maximum, target logit and sum of exponentials (last stage,
    one fp32 value per token each)."""
    ends = 2 if pp == 1 else 1
    return (ends * collective_time("all_reduce", act_bytes, tp, link)
            + 3 * collective_time("all_reduce", 4 * tokens, tp, link))


def step_time(shape: TransformerShape, par: Parallelism, cluster: Cluster,
              global_batch: int, value_bytes: int = 2, optimizer: str = "adamw",
              assumptions: Assumptions = ASSUMED) -> StepTime:
    """Modelled seconds per training step, split into its parts.

    ``value_bytes``: bytes of one activation or gradient value on the wire (2 for the
    16-bit training of large models, 4 for fp32 training as in the course's small runs).
    ``optimizer`` ("adamw" or "sgd") counts only where the cluster models memory.
    ``assumptions``: what selective recomputation costs and how much of the data-parallel
    collectives stays exposed (:class:`Assumptions`).
    """
    check_optimizer(optimizer)
    if not isinstance(assumptions, Assumptions):
        raise TypeError(f"assumptions must be an Assumptions, not {type(assumptions).__name__}")
    dp, tp, pp = par.dims.dp, par.dims.tp, par.dims.pp
    if shape.layers % pp:
        raise ValueError(f"pp={pp} does not divide {shape.layers} layers")
    if shape.heads % tp:
        raise ValueError(f"tp={tp} does not divide {shape.heads} heads")
    m, microbatch_size = par.recipe.split(global_batch, dp)
    tokens = global_batch * shape.seq_len
    rate = cluster.peak_flops * cluster.efficiency
    flops = training_flops(shape, tokens, par.recompute)
    if par.recompute == "selective":
        flops *= 1 + assumptions.selective_extra
    compute = flops / par.devices / rate
    compute += cluster.layer_overhead * m * (shape.layers // pp)
    memory = {}
    if cluster.memory_bandwidth != float("inf"):
        memory = memory_bound_seconds(shape, dp, tp, pp, tokens,
                                      cluster.memory_bandwidth, optimizer, value_bytes)
    pipelined = compute + memory.get("element-wise", 0.0)
    bubble = pipelined * pipeline_bubble(pp, m) / (1 - pipeline_bubble(pp, m))

    act_bytes = value_bytes * microbatch_size * shape.seq_len * shape.hidden
    layers_here = shape.layers // pp
    tp_link = group_link(par, "tp", cluster)
    tp_comm = 0.0
    if tp_link:
        per_layer = 6 if par.recompute == "full" else 4
        tp_comm = m * (layers_here * per_layer
                       * collective_time("all_reduce", act_bytes, tp, tp_link)
                       + vocabulary_all_reduces(act_bytes, microbatch_size * shape.seq_len,
                                                tp, pp, tp_link))
    pp_link = group_link(par, "pp", cluster)
    pp_comm = 2 * m * (pp_link.alpha + act_bytes / tp / pp_link.beta) if pp_link else 0.0

    dp_link = group_link(par, "dp", cluster)
    dp_total = grad_sync_seconds(shape.num_params, value_bytes, par, dp, dp_link, m)
    if par.dp_overlap:
        dp_comm = max(grad_sync_exposed(shape.num_params, value_bytes, par, dp, dp_link, m,
                                        pipelined / m),
                      assumptions.dp_exposed_share * dp_total)
    else:
        dp_comm = dp_total
    details = {"flops_per_device": flops / par.devices,
               "links": {a: (group_link(par, a, cluster).name if group_link(par, a, cluster)
                             else "-") for a in AXES}, "memory-bound": memory}
    return StepTime(compute, bubble, tp_comm, pp_comm, dp_comm, m, details, sum(memory.values()))
