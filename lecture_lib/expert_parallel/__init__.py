"""Expert parallelism: a mixture of experts whose experts live on different ranks.

A mixture-of-experts layer replaces a transformer's MLP by ``E`` MLPs and a
router that sends each token through ``k`` of them (Shazeer et al. 2017;
GShard, Lepikhin et al. 2020; Switch Transformer, Fedus, Zoph & Shazeer
2021). Expert parallelism puts ``E / p`` experts on each of ``p`` ranks and
moves the tokens to their experts and back with two all-to-alls.

Read in this order:

* :mod:`.router`: top-k routing, capacity in one global order, the load-balancing loss;
* :mod:`.dispatch`: the count exchange, the dispatch plan, the differentiable all-to-all;
* :mod:`.layer`: :class:`MoELayer` (route, plan, dispatch, experts, combine) and :class:`MoEGPT`;
* :mod:`.experiments`: training equal to one process, drop rates, timed phases (notebook 07);
  imported by its module (``from lecture_lib.expert_parallel import experiments as epx``),
  the package exports only the algorithm above.

``group=LOCAL`` (the same value as :data:`lecture_lib.comm.LOCAL`) keeps every
expert in this process: the one-process reference.
"""
from ..comm import LOCAL
from .dispatch import AllToAll, DispatchPlan, all_to_all, exchange_counts, plan_dispatch
from .layer import MoEGPT, MoELayer, sum_replicated_grads
from .router import (
    Admission,
    MoEConfig,
    Routing,
    admit,
    check_moe,
    expert_capacity,
    load_balancing_loss,
    top_k_route,
)

__all__ = [
    "LOCAL", "Admission", "AllToAll", "DispatchPlan", "MoEConfig", "MoEGPT", "MoELayer",
    "Routing", "admit", "all_to_all", "check_moe", "exchange_counts", "expert_capacity",
    "load_balancing_loss", "plan_dispatch", "sum_replicated_grads", "top_k_route",
]
