"""The tensor-parallel notebook's hand calculations: one GPT-3 175B layer under tensor parallelism.

The layer is Brown et al. 2020's (Table 2.1: s = 2048, h = 12288, a = 96), one sequence per
micro-batch, 16-bit activations, tp = 8 (one node). Activations from Korthikanti et al. 2022
(:func:`lecture_lib.costmodel.memory.activation_bytes_per_layer`), bytes from Megatron's four
all-reduces (:func:`lecture_lib.costmodel.tensor_parallel.tp_block_comm`), time shares from
:func:`lecture_lib.costmodel.tensor_parallel.tp_layer_time`.
"""
from __future__ import annotations

from ..costmodel import INFINIBAND_NDR, NVLINK_H100
from ..costmodel.memory import PRESETS, activation_bytes_per_layer
from ..costmodel.tensor_parallel import sent_bytes, tp_block_comm, tp_layer_time
from . import fmt

GPT3 = PRESETS["GPT-3 175B"]
TP = 8


def activation_per_gpu() -> list[str]:
    """Q1: bytes one layer stores per GPU: no TP, tp = 8 plain, tp = 8 with SP."""
    args = (GPT3.seq_len, 1, GPT3.hidden, GPT3.heads)
    return [fmt(activation_bytes_per_layer(*args) / 1e9, "GB"),
            fmt(activation_bytes_per_layer(*args, tp=TP) / 1e9, "GB"),
            fmt(activation_bytes_per_layer(*args, tp=TP, sequence_parallel=True) / 1e9, "GB")]


def all_reduce_bytes() -> list[str]:
    """Q2: the all-reduce buffer and the bytes one rank sends per layer per step (bf16)."""
    comm = tp_block_comm(1, GPT3.seq_len, GPT3.hidden, TP, bytes_per_element=2)
    calls, buffer = comm["forward"]["all_reduce"]
    sent = sum(sent_bytes(comm[phase], TP) for phase in ("forward", "backward"))
    return [fmt(buffer / 1e6, "MB"), fmt(sent / 1e6, "MB")]


def comm_shares() -> list[str]:
    """Q3: the modelled communication share of that layer's step on NVLink and InfiniBand."""
    shares = [tp_layer_time(1, GPT3.seq_len, GPT3.hidden, TP, link)["comm_share"]
              for link in (NVLINK_H100, INFINIBAND_NDR)]
    return [fmt(100 * s, "%", 2) for s in shares]


ANSWERS = {"Q1": activation_per_gpu, "Q2": all_reduce_bytes, "Q3": comm_shares}
