"""Notebook 03 (memory): GPT-2 small's activations at real size (section 3), and Q2.

* ``gpt2_small_memory``: GPT-2 small (``models.REAL_SIZE``) on one GPU, 8 sequences of 1024
  tokens under bf16 autocast (16-bit activations; fp32 weights, gradients and AdamW state), by
  recomputation (``costmodel.memory_per_device``, activations after Korthikanti et al. 2022,
  Table 2).
* Q2: the Llama-style 8B preset (``costmodel.PRESETS``), one sequence of 4096 tokens, 16-bit
  activations: the activations it keeps per layer and in all with no recomputation, with
  selective recomputation and with every layer checkpointed; its model state on one GPU, and
  its whole memory per GPU under ZeRO-1 on 8 GPUs with selective recomputation (notebook 03b).
"""
from __future__ import annotations

from ..costmodel import PRESETS, memory_per_device
from ..costmodel.memory import TransformerShape
from ..models import REAL_SIZE
from . import fmt

AUTOCAST = "autocast (bf16 compute, fp32 weights)"
SEQUENCES = 8
RECOMPUTE = ("none", "selective", "full")


def gpt2_small_memory(recompute: str) -> dict:
    """Bytes by kind on one GPU: GPT-2 small, 8 x 1024 tokens, autocast, ``recompute``."""
    m = REAL_SIZE["GPT-2 small"]
    shape = TransformerShape("GPT-2 small", m.n_layers, m.d_model, m.n_heads, m.vocab_size,
                             m.seq_len, m.num_params())
    return memory_per_device(shape, microbatch_size=SEQUENCES, recompute=recompute,
                             precision=AUTOCAST)


def q2() -> list[str]:
    shape = PRESETS["Llama-style 8B"]
    acts = {rc: memory_per_device(shape, seq_len=4096, microbatch_size=1,
                                  recompute=rc)["activations"] for rc in RECOMPUTE}
    state = 16 * shape.num_params                      # Adam's 16 bytes per parameter, on one GPU
    zero1 = memory_per_device(shape, dp=8, zero_stage=1, seq_len=4096, microbatch_size=1,
                              recompute="selective")["total"]    # notebook 03b's calculator
    return [fmt(acts["none"] / shape.layers / 1e9, "GB"), fmt(acts["none"] / 1e9, "GB"),
            fmt(acts["selective"] / 1e9, "GB"), fmt(acts["full"] / 1e9, "GB"),
            fmt(state / 1e9, "GB"), fmt(zero1 / 1e9, "GB")]


ANSWERS = {"Q2": q2}
