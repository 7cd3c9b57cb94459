"""Training FLOPs per token, and model FLOPs utilisation (MFU): each formula written once.

* :func:`model_flops_per_token`: ``6 N + 12 L s h`` FLOPs per token for forward and
  backward (Chowdhery et al. 2022, "PaLM", appendix B; Kaplan et al. 2020, section
  2.1, for ``6 N``; Korthikanti et al. 2022 for the attention term). The step-time
  model (:func:`.steptime.training_flops`), MFU and the capstone all count with it.
* :func:`non_embedding_params` and :func:`gpt_flops_per_token`: the ``N`` of a model,
  counted on the model itself (its token and position embeddings left out), and the
  FLOPs per token of the course's GPT (:class:`lecture_lib.models.GPT`; built on the
  ``meta`` device it costs no memory).
* :func:`mfu`: achieved model FLOP/s over the devices' peak, ``6 N T / (t R_peak)`` for
  ``T`` tokens in ``t`` seconds; :func:`training_days`, the same identity solved for time
  (``6 N D`` FLOPs for ``D`` tokens).

Notation (the course's): ``N`` non-embedding parameters, ``L`` layers, ``s`` sequence
length, ``h`` hidden size (``d_model``), ``T`` tokens, ``t`` time in seconds.
"""
from __future__ import annotations

import math
import numbers

#: Parameters that do a lookup, not a matmul: left out of ``N`` by convention.
EMBEDDINGS = ("tok_emb.weight", "pos_emb.weight")


def model_flops_per_token(n_params: float, n_layers: int = 0, seq_len: int = 0,
                          d_model: int = 0) -> float:
    """Training FLOPs per token: ``6 N + 12 L s h`` (Chowdhery et al. 2022, appendix B).

    ``6 N``: a multiply-add (2 FLOPs) per parameter forward, twice that backward;
    ``12 L s h``: the attention scores and their weighted sum (``Q K^T`` and
    ``A V``, ``2 s h`` FLOPs each per token and layer forward, for sequence length
    ``s`` and hidden size ``h``, times 3 with the backward), which no parameter
    accounts for. ``N`` excludes the embedding
    tables by convention (they do a lookup, not a matmul). Recomputation is
    not counted: this is *model* FLOPs, not hardware FLOPs.
    """
    if isinstance(n_params, bool) or not isinstance(n_params, numbers.Real) \
            or not math.isfinite(n_params) or n_params < 0:
        raise ValueError(f"n_params must be a number >= 0, not {n_params!r}")
    for name, value in (("n_layers", n_layers), ("seq_len", seq_len), ("d_model", d_model)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a whole number >= 0, not {value!r}")
    return 6.0 * n_params + 12.0 * n_layers * seq_len * d_model


def non_embedding_params(model) -> int:
    """``N`` of a model: its parameters less the token and position embeddings (the head is a
    matmul and counts)."""
    return sum(p.numel() for name, p in model.named_parameters() if name not in EMBEDDINGS)


def gpt_flops_per_token(model) -> float:
    """:func:`model_flops_per_token` of the course's GPT: ``N`` counted on ``model``
    (:func:`non_embedding_params`), ``L``, ``s`` and ``h`` from ``model.cfg`` (``n_layers``,
    ``seq_len``, ``d_model``)."""
    cfg = model.cfg
    return model_flops_per_token(non_embedding_params(model), cfg.n_layers, cfg.seq_len,
                                 cfg.d_model)


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float,
        devices: int = 1) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the devices' peak,
    ``6 N T / (t R_peak)`` with ``flops_per_token = 6 N`` (plus attention's term).

    ``tokens_per_s`` is the whole job's throughput (``T / t``), ``peak_flops`` one
    device's dense peak ``R_peak`` (e.g. ``emulate.H100_SXM.bf16_flops``): which peak is
    the caller's choice, so say it beside the MFU.
    """
    if not tokens_per_s >= 0 or not flops_per_token > 0 or not peak_flops > 0 or devices < 1:
        raise ValueError("mfu needs tokens_per_s >= 0, flops_per_token > 0, peak_flops > 0 "
                         "and devices >= 1")
    return tokens_per_s * flops_per_token / (peak_flops * devices)


def training_days(flops_per_token: float, tokens: float, peak_flops: float, devices: int,
                  mfu_value: float) -> float:
    """Days to train on ``tokens`` tokens (``D``): ``D * flops_per_token / (devices * peak * MFU)``.

    :func:`mfu` solved for time: at utilisation ``mfu_value`` the job does
    ``devices * peak_flops * mfu_value`` model FLOP/s. With ``flops_per_token = 6 N``
    (:func:`model_flops_per_token` of ``N`` parameters) this is the ``6 N D`` estimate
    (Kaplan et al. 2020, section 2.1).
    """
    if not flops_per_token > 0 or not tokens > 0 or not peak_flops > 0 or devices < 1 \
            or not 0 < mfu_value <= 1:
        raise ValueError("training_days needs flops_per_token > 0, tokens > 0, peak_flops > 0, "
                         "devices >= 1 and 0 < mfu_value <= 1")
    return tokens * flops_per_token / (devices * peak_flops * mfu_value) / 86400.0
