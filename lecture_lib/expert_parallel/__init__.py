"""Expert parallelism: a mixture of experts whose experts live on different ranks.

A mixture-of-experts layer replaces a transformer's MLP by ``E`` MLPs and a
router that sends each token through ``k`` of them (Shazeer et al. 2017;
GShard, Lepikhin et al. 2020; Switch Transformer, Fedus, Zoph & Shazeer
2021). Expert parallelism puts ``E / p`` experts on each of ``p`` ranks and
moves the tokens to their experts and back with two all-to-alls.

Read in this order:

* :mod:`.router`: top-k routing (or a routing fixed before the step), capacity in one
  global order, the load-balancing loss;
* :mod:`.dispatch`: the differentiable all-to-all, the count exchange, the dispatch plan;
* :mod:`.layer`: :class:`MoELayer` (route, count, dispatch, experts, combine) and :class:`MoEGPT`;
* :mod:`.experiments`: training equal to one process, drop rates, the layer timed on real
  ranks; :mod:`.emulated`: the layer at real size on emulated GPUs, in the dry run (notebook
  07). Each is imported by its module (``from lecture_lib.expert_parallel import
  experiments as epx``): the package exports only the algorithm above.

``group=LOCAL`` (the same value as :data:`lecture_lib.comm.LOCAL`) keeps every
expert in this process: the one-process reference.
"""
from ..comm import LOCAL
from .dispatch import AllToAll, DispatchPlan, all_to_all, exchange_counts, plan_dispatch
from .layer import MoEGPT, MoELayer, sum_replicated_grads
from .router import (
    Admission,
    FixedRouting,
    MoEConfig,
    Routing,
    admit,
    check_moe,
    count_table,
    draw_choices,
    expert_capacity,
    fill_slots,
    load_balancing_loss,
    top_k_route,
)

__all__ = [
    "LOCAL", "Admission", "AllToAll", "DispatchPlan", "FixedRouting", "MoEConfig", "MoEGPT",
    "MoELayer", "Routing", "admit", "all_to_all", "check_moe", "count_table", "draw_choices",
    "exchange_counts", "expert_capacity", "fill_slots", "load_balancing_loss", "plan_dispatch",
    "sum_replicated_grads", "top_k_route",
]
