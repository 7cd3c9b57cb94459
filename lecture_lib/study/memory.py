"""Notebook 03 (memory): its hand calculation, GPT-2 small's activations at real size.

* Q2: GPT-2 small (``models.REAL_SIZE``) on one GPU, 8 sequences of 1024 tokens under bf16
  autocast (16-bit activations, fp32 weights, gradients and AdamW state): the activations it
  keeps with no recomputation, selective recomputation and every block checkpointed
  (``costmodel.memory_per_device``, activations after Korthikanti et al. 2022, Table 2), one
  layer's activations (what a checkpointed block rebuilds in its backward), and its model state.
"""
from __future__ import annotations

from ..costmodel import memory_per_device
from ..costmodel.memory import TransformerShape
from ..models import REAL_SIZE
from . import fmt

AUTOCAST = "autocast (bf16 compute, fp32 weights)"
SEQUENCES = 8


def gpt2_small_memory(recompute: str) -> dict:
    """Bytes by kind on one GPU: GPT-2 small, 8 x 1024 tokens, autocast, ``recompute``."""
    m = REAL_SIZE["GPT-2 small"]
    shape = TransformerShape("GPT-2 small", m.n_layers, m.d_model, m.n_heads, m.vocab_size,
                             m.seq_len, m.num_params())
    return memory_per_device(shape, microbatch_size=SEQUENCES, recompute=recompute,
                             precision=AUTOCAST)


def q2() -> list[str]:
    runs = {r: gpt2_small_memory(r) for r in ("none", "selective", "full")}
    layer = runs["none"]["activations"] / REAL_SIZE["GPT-2 small"].n_layers
    state = sum(runs["none"][k] for k in ("params", "grads", "optimizer"))
    return [fmt(runs["none"]["activations"] / 1e9, "GB"), fmt(layer / 1e6, "MB"),
            fmt(runs["selective"]["activations"] / 1e9, "GB"),
            fmt(runs["full"]["activations"] / 1e6, "MB"), fmt(state / 1e9, "GB")]


ANSWERS = {"Q2": q2}
