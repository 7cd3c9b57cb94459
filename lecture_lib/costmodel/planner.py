"""A configuration planner in the spirit of automatic parallelism (Alpa, OneFlow).

Alpa (Zheng et al. 2022) searches inter- and intra-operator parallelism with a
cost model; we do the same search by brute force, which a model this size
allows: for a model, a cluster and a global batch, take every
``(dp, tp, pp, micro-batch, ZeRO stage, recomputation, inner axis)`` that divides
(:func:`.search_space.candidates`), drop what does not fit in device memory
(:func:`memory_per_device`), rank the rest by modelled step time
(:func:`step_time`), and say why the winner wins.
Two more axes reuse that machinery: :func:`plan_context_parallel` (cp, long
sequences) and :func:`plan_expert_parallel` (ep carved out of dp, mixture of experts).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .comm import collective_time
from .context_parallel import cp_exposed_comm, memory_per_device_cp
from .memory import TransformerShape, memory_per_device
from .moe import MoESpec, dispatch_buffer_bytes, memory_per_device_ep, moe_param_split
from .search_space import candidates, divisors
from .steptime import (
    ASSUMED,
    Assumptions,
    Cluster,
    Parallelism,
    StepTime,
    grad_sync_exposed,
    group_link,
    step_time,
)


@dataclass
class Plan:
    parallelism: Parallelism
    time: StepTime
    memory: dict

    @property
    def seconds(self) -> float:
        return self.time.total


def plan(shape: TransformerShape, cluster: Cluster, global_batch: int, top: int | None = None,
         devices: int | None = None, assumptions: Assumptions = ASSUMED) -> list[Plan]:
    """Configurations that fit, fastest first, under the step model's ``assumptions``."""
    devices = devices or cluster.devices
    if global_batch < 1:
        raise ValueError(f"global batch must be >= 1, not {global_batch}")
    found = []
    for par in candidates(shape, devices, global_batch, cluster.gpus_per_node):
        d, r = par.dims, par.recipe
        mem = memory_per_device(shape, d.dp, d.tp, d.pp, r.zero_stage, r.microbatch_size,
                                recompute=par.recompute)
        if mem["total"] > cluster.memory_bytes:
            continue
        found.append(Plan(par, step_time(shape, par, cluster, global_batch,
                                         assumptions=assumptions), mem))
    if not found:
        raise ValueError(f"no configuration of {shape.name} on {devices} devices with a global "
                         f"batch of {global_batch} fits in {cluster.memory_bytes / 1e9:g} GB per "
                         "device (is the batch divisible into micro-batches? more devices?)")
    found.sort(key=lambda p: (p.seconds, p.memory["total"]))   # ties: the leaner one
    return found[:top] if top else found


def rank_of(plans: list[Plan], par: Parallelism) -> int | None:
    """1-based position of ``par`` among ``plans`` (None when it did not fit)."""
    for i, p in enumerate(plans, 1):
        if p.parallelism == par:
            return i
    return None


def explain(best: Plan, plans: list[Plan]) -> str:
    """Why the winner wins, in words: its parts, and what the runners-up lost on."""
    t, par = best.time, best.parallelism
    parts = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in t.parts().items() if v > 0)
    lines = [f"Best: {par.label()}: {t.total:.2f} s per step ({parts}); "
             f"{best.memory['total'] / 1e9:.1f} GB per device; links {t.details['links']}."]
    seen, runners = {(par.dims.dp, par.dims.tp, par.dims.pp)}, []
    for other in plans:                      # the best of each of the next three grids
        d = other.parallelism.dims
        grid = (d.dp, d.tp, d.pp)
        if grid not in seen and len(runners) < 3:
            seen.add(grid)
            runners.append(other)
    for other in runners:
        diff = {k: other.time.parts()[k] - v for k, v in t.parts().items()}
        worst = max(diff, key=diff.get)
        lines.append(f"  {other.parallelism.label()}: +{(other.seconds - t.total) * 1e3:.0f} ms, "
                     f"mostly {worst} (+{diff[worst] * 1e3:.0f} ms)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Context parallelism for long sequences (lecture_lib.costmodel.context_parallel)
# ----------------------------------------------------------------------------

CONTEXT_PARALLEL = (1, 2, 4, 8, 16, 32)


def _dp_exposed(shape, par, cp: int, cluster: Cluster, microbatches: int,
                microbatch_compute: float) -> float:
    """The gradient sync over the ``dp x cp`` ranks less the backward passes that hide it."""
    d = par.dims
    ranks = d.dp * cp
    link = cluster.intra if ranks * d.tp * d.pp <= cluster.gpus_per_node else cluster.inter
    return grad_sync_exposed(shape.num_params, 2, par, ranks, link, microbatches,
                             microbatch_compute)


@dataclass
class ContextParallelPlan:
    """A plan for ``devices / cp`` ranks, each of its ranks a cp group sharing the sequence."""
    cp: int
    plan: Plan                 # times and memory per device, already divided by cp
    cp_comm: float             # exposed ring-attention sends (seconds per step)

    @property
    def seconds(self) -> float:
        return self.plan.seconds + self.cp_comm

    def label(self) -> str:
        """The whole layout, cp included (``plan`` models one rank of a cp group, cp = 1)."""
        par = self.plan.parallelism
        return par.label(replace(par.dims, cp=self.cp))


def plan_context_parallel(shape: TransformerShape, cluster: Cluster, global_batch: int,
                          cps=CONTEXT_PARALLEL, top: int | None = None) -> list:
    """:func:`plan` with a cp axis (placed just outside tp), fastest first.

    Each cp rank does ``1/cp`` of the compute, tensor- and pipeline-parallel
    traffic of its group's sequence and stores ``1/cp`` of its activations
    (:func:`~.context_parallel.memory_per_device_cp`); the data-parallel
    all-reduce runs over ``dp x cp`` ranks (same bytes); ring attention's sends
    count only where the attention of the held block does not hide them
    (:func:`~.context_parallel.cp_exposed_comm`).
    """
    found = []
    for cp in cps:
        if cluster.devices % cp or shape.seq_len % (2 * cp):
            continue
        for par in candidates(shape, cluster.devices // cp, global_batch, cluster.gpus_per_node):
            d, r = par.dims, par.recipe
            mem = memory_per_device_cp(shape, cp, d.dp, d.tp, d.pp, r.zero_stage,
                                       r.microbatch_size, par.recompute)
            if mem["total"] > cluster.memory_bytes:
                continue
            t = step_time(shape, par, cluster, global_batch)
            compute = t.compute / cp
            t = replace(t, compute=compute, bubble=t.bubble / cp, tp_comm=t.tp_comm / cp,
                        pp_comm=t.pp_comm / cp,
                        dp_comm=_dp_exposed(shape, par, cp, cluster, t.microbatches,
                                            compute / t.microbatches))
            link = None if cp == 1 else (cluster.intra if d.tp * cp <= cluster.gpus_per_node
                                         else cluster.inter)
            exposed = cp_exposed_comm(shape, r.microbatch_size, cp, link,
                                      cluster.peak_flops * cluster.efficiency)
            cp_comm = exposed * t.microbatches * shape.layers // d.pp
            found.append(ContextParallelPlan(cp, Plan(par, t, mem), cp_comm))
    if not found:
        raise ValueError(f"no configuration of {shape.name} at {shape.seq_len} tokens fits in "
                         f"{cluster.memory_bytes / 1e9:g} GB per device with cp in {tuple(cps)}")
    found.sort(key=lambda p: (p.seconds, p.plan.memory["total"]))
    return found[:top] if top else found


# ----------------------------------------------------------------------------
# Expert parallelism for mixture-of-experts models (lecture_lib.costmodel.moe)
# ----------------------------------------------------------------------------

@dataclass
class ExpertParallelPlan:
    """A ``dp x tp x pp`` plan whose dp ranks form expert-parallel groups of ``ep``."""
    ep: int
    plan: Plan                 # compute, bubble, tp, pp and gradient sync; memory with experts
    all_to_all: float          # seconds per step of the dispatch and combine all-to-alls
    links: dict                # the link of the all-to-all and of each gradient sync

    @property
    def seconds(self) -> float:
        return self.plan.seconds + self.all_to_all

    def parts(self) -> dict:
        return {**self.plan.time.parts(), "expert all-to-all": self.all_to_all}

    def label(self) -> str:
        par = self.plan.parallelism
        return par.label(replace(par.dims, ep=self.ep))


def expert_parallel_step(shape: TransformerShape, moe: MoESpec, ep: int, par: Parallelism,
                         cluster: Cluster, global_batch: int, value_bytes: int = 2):
    """``(StepTime, all-to-all seconds, links)`` of one step of the MoE model.

    :func:`step_time` of the model's *active* parameters gives compute (``c k`` experts
    per token), bubble, tensor- and pipeline-parallel time (the MoE layer's tp traffic
    counted as the dense MLP's). The gradient sync is two all-reduces: the dense
    gradients over ``dp`` ranks, the experts' over the ``dp/ep`` ranks holding the same
    experts (one all-reduce at ``ep = 1``), hidden behind the last backward as far as it
    goes. Each MoE layer adds 2 all-to-alls (dispatch, combine) forward and 2 backward
    (6 with full recomputation) per micro-batch over the ``ep`` group, each rank sending
    its ``b s / tp`` tokens (Megatron-Core runs MoE with tp under sequence parallelism)
    ``k`` times, padded to the capacity factor; not overlapped with compute. Memory-bound
    work, where a cluster models it, is counted on the active parameters only.
    """
    d = par.dims
    if d.dp % ep:
        raise ValueError(f"ep={ep} must divide dp={d.dp}: expert-parallel groups are carved "
                         "out of the data-parallel ranks")
    split = moe_param_split(shape, moe)
    if moe.num_experts % ep:
        raise ValueError(f"ep={ep} does not divide the {moe.num_experts} experts")
    t = step_time(replace(shape, num_params=split["active"]), par, cluster, global_batch,
                  value_bytes)
    dp_link = group_link(par, "dp", cluster)
    pipelined = t.compute + t.details["memory-bound"].get("element-wise", 0.0)
    m = t.microbatches
    if ep == 1:
        sync = grad_sync_exposed(split["total"], 2, par, d.dp, dp_link, m, pipelined / m)
    else:
        sync = grad_sync_exposed(split["dense"], 2, par, d.dp, dp_link, m, pipelined / m,
                                 also=((split["expert"] / ep, d.dp // ep),))
    t = replace(t, dp_comm=sync)
    ep_link = group_link(replace(par, dims=replace(d, dp=ep)), "dp", cluster)  # dp's fastest ep
    a2a = 0.0
    if ep_link:
        tokens = moe.capacity_factor * par.recipe.microbatch_size * shape.seq_len / d.tp
        one = collective_time("all_to_all", dispatch_buffer_bytes(tokens, shape.hidden, moe.k,
                                                                   value_bytes), ep, ep_link)
        per_layer = 6 if par.recompute == "full" else 4
        a2a = t.microbatches * (moe.moe_layers(shape.layers) // d.pp) * per_layer * one
    links = {"all-to-all": ep_link.name if ep_link else "-",
             "gradients": dp_link.name if dp_link else "-"}
    return t, a2a, links


def plan_expert_parallel(shape: TransformerShape, moe: MoESpec, cluster: Cluster,
                         global_batch: int, eps=None, top: int | None = None,
                         devices: int | None = None) -> list:
    """:func:`plan` for an MoE model with an ``ep`` axis carved out of dp, fastest first.

    Megatron-Core and DeepSpeed-MoE lay expert parallelism out so: the ``ep`` ranks of a
    group are ``ep`` adjacent data-parallel ranks (``ep`` divides dp; Megatron's separate
    expert-tensor-parallel size is not modelled: experts split over tp like the dense
    layers); a device holds ``E/ep`` experts (:func:`~.moe.memory_per_device_ep`); time
    as :func:`expert_parallel_step`. ``eps``: every divisor of the experts unless given;
    one that does not divide them raises.
    """
    devices = devices or cluster.devices
    eps = tuple(divisors(moe.num_experts)) if eps is None else tuple(eps)
    bad = [e for e in eps if isinstance(e, bool) or not isinstance(e, int) or e < 1
           or moe.num_experts % e]
    if bad:
        raise ValueError(f"ep in {bad} does not divide the {moe.num_experts} experts")
    found = []
    for par in candidates(shape, devices, global_batch, cluster.gpus_per_node):
        d, r = par.dims, par.recipe
        for ep in eps:
            if d.dp % ep:
                continue
            mem = memory_per_device_ep(shape, moe, ep, d.dp, d.tp, d.pp, r.zero_stage,
                                       r.microbatch_size, par.recompute)
            if mem["total"] > cluster.memory_bytes:
                continue
            t, a2a, links = expert_parallel_step(shape, moe, ep, par, cluster, global_batch)
            found.append(ExpertParallelPlan(ep, Plan(par, t, mem), a2a, links))
    if not found:
        raise ValueError(f"no configuration of the MoE {shape.name} on {devices} devices with "
                         f"ep in {tuple(eps)} fits in {cluster.memory_bytes / 1e9:g} GB per device")
    found.sort(key=lambda p: (p.seconds, p.plan.memory["total"]))
    return found[:top] if top else found


def explain_expert_parallel(best: ExpertParallelPlan, plans: list) -> str:
    """Why the winner wins: its parts, then the best plan of each other ep and what it lost on."""
    parts = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in best.parts().items() if v > 0)
    mem = best.plan.memory
    lines = [f"Best: {best.label()}: {best.seconds:.2f} s per step ({parts}); "
             f"{mem['total'] / 1e9:.1f} GB per device, experts {mem['experts'] / 1e9:.1f} GB; "
             f"all-to-all on {best.links['all-to-all']}."]
    for ep in sorted({p.ep for p in plans} - {best.ep}):
        other = next(p for p in plans if p.ep == ep)
        diff = {k: other.parts()[k] - v for k, v in best.parts().items()}
        worst = max(diff, key=diff.get)
        more = (other.seconds - best.seconds) * 1e3
        lines.append(f"  best with ep={ep}: {other.label()}: +{more:.0f} ms, mostly {worst} "
                     f"(+{diff[worst] * 1e3:.0f} ms); "
                     f"{other.plan.memory['total'] / 1e9:.1f} GB per device")
    return "\n".join(lines)
