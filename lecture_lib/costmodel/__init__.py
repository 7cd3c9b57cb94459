"""Formulas: memory per device, FLOPs, communication volume and time, step time.

One submodule per kind of cost; the names below are re-exported here.
* :mod:`.comm`: the alpha-beta model, ring-collective times, link presets.
* :mod:`.ddp`: data-parallel overhead against bucket size.
* :mod:`.memory`: model states under ZeRO, activations (Korthikanti et al.), per device.
* :mod:`.tensor_parallel`: bytes per block under tensor parallelism; a layer's modelled step.
* :mod:`.pipeline`: the pipeline bubble and activation memory, in closed form.
* :mod:`.moe`: mixture-of-experts parameters, FLOPs per token, all-to-all bytes, memory
  per device under expert parallelism.
* :mod:`.context_parallel`: activations under cp, ring vs Ulysses bytes, exposed ring time.
* :mod:`.traffic`: memory-bound work (element-wise ops, optimizer, gradient buffer) in bytes.
* :mod:`.flops`: training FLOPs per token (``6 N + 12 L s h``), MFU, training days.
* :mod:`.steptime`: step time of 3-D parallel training on a two-tier network.
* :mod:`.planner`: search the configurations that fit, rank them by step time (cp and
  ep axes included).
"""
from .comm import (
                   INFINIBAND_HDR,
                   INFINIBAND_NDR,
                   NVLINK_A100,
                   NVLINK_H100,
                   Link,
                   bus_factor,
                   collective_time,
                   fit_alpha_beta,
)
from .context_parallel import (
                   cp_activation_bytes_per_layer,
                   cp_exposed_comm,
                   memory_per_device_cp,
                   ring_bytes_per_layer,
                   ulysses_bytes_per_layer,
)
from .ddp import best_bucket_bytes, ddp_overhead, fit_ddp_overhead, two_stream_step
from .flops import (
                   gpt_flops_per_token,
                   mfu,
                   model_flops_per_token,
                   non_embedding_params,
                   training_days,
)
from .memory import (
                   GB,
                   PRESETS,
                   TransformerShape,
                   activation_bytes_per_layer,
                   check_zero_stage,
                   memory_per_device,
                   min_devices_for_states,
                   model_state_breakdown,
                   model_state_bytes,
)
from .moe import (
                   MoESpec,
                   all_to_all_bytes,
                   dispatch_buffer_bytes,
                   memory_per_device_ep,
                   mlp_params,
                   moe_flops_per_token,
                   moe_param_split,
                   moe_params,
)
from .pipeline import (
                   microbatches_for_bubble,
                   peak_microbatches,
                   pipeline_bubble,
                   pipeline_bubble_unequal,
                   pipeline_step_time,
                   zb_h1_bubble,
)
from .planner import (
                   ContextParallelPlan,
                   ExpertParallelPlan,
                   Plan,
                   expert_parallel_step,
                   explain,
                   explain_expert_parallel,
                   plan,
                   plan_context_parallel,
                   plan_expert_parallel,
                   rank_of,
)
from .steptime import (
                   A100_CLUSTER,
                   ASSUMED,
                   H100_CLUSTER,
                   Assumptions,
                   Cluster,
                   Parallelism,
                   StepTime,
                   group_link,
                   step_time,
                   training_flops,
)
from .tensor_parallel import (
                   H100_BF16_FLOPS,
                   sent_bytes,
                   tp_block_comm,
                   tp_layer_flops,
                   tp_layer_time,
)
from .traffic import OPTIMIZER_VALUES, layer_values, memory_bound_seconds, optimizer_seconds
