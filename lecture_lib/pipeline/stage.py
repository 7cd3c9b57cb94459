"""Stages of the small GPT: contiguous blocks, the embedding first, the head last.

A pipeline cuts the model's layers into ``num_stages * chunks`` contiguous
*virtual stages* (Huang et al. 2019, "GPipe"; with ``chunks > 1`` Megatron-LM's
interleaved layout, Narayanan et al. 2021), equal by default; ``layers`` gives
each its own number of blocks (an unequal split: the slowest stage then sets the
pipeline's pace; Llama 3 takes a block off the first and the last stage to make
room for the embedding and the head, Dubey et al. 2024, section 3.3.2). The
first holds the token and position embeddings, the last the final layer norm
and the head; the loss is computed by the executor on the last stage's logits.

A :class:`PipelineChunk` shares its modules with the :class:`~lecture_lib.models.GPT`
it was cut from, so parameter names are the full model's
(``blocks.3.attn.q.weight``) and the chunks of all ranks together compare one
to one with the one-process model.
"""
from __future__ import annotations

import torch.nn as nn

from ..models import GPT, GPTConfig
from .actions import Schedule


class PipelineChunk(nn.Module):
    """Blocks ``layers`` of ``gpt``; the embedding if ``first``, the head if ``last``.

    The first chunk embeds with the model's own :meth:`GPT.embed`, the last
    projects with its :meth:`GPT.logits`, both bound to ``gpt`` (whose
    ``tok_emb``/``pos_emb`` and ``ln_f``/``head`` modules this chunk holds).
    """

    def __init__(self, gpt: GPT, layers: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        self.embed = self.logits = None
        if first:
            self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb
            self.embed = gpt.embed
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in layers})
        if last:
            self.ln_f, self.head = gpt.ln_f, gpt.head
            self.logits = gpt.logits

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        return self.logits(x) if self.logits is not None else x


def check_split(n_layers: int, num_stages: int, chunks: int = 1, layers=None) -> None:
    """Clear error unless ``n_layers`` splits into ``num_stages * chunks`` equal chunks, or
    into the given ``layers`` (blocks per virtual stage, in order, each >= 1)."""
    parts = num_stages * chunks
    if layers is not None:
        layers = tuple(layers)
        if len(layers) != parts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                                       for n in layers):
            raise ValueError(f"layers must give a whole number >= 1 of blocks for each of the "
                             f"{parts} model chunks ({num_stages} stages x {chunks} chunks), "
                             f"not {layers!r}")
        if sum(layers) != n_layers:
            raise ValueError(f"layers {layers!r} hold {sum(layers)} blocks, but the model has "
                             f"{n_layers} layers")
        return
    if parts > n_layers:
        raise ValueError(f"more pipeline stages than layers: {num_stages} stages x {chunks} "
                         f"chunks = {parts} model chunks, but the model has {n_layers} layers")
    if n_layers % parts:
        raise ValueError(f"{n_layers} layers do not split evenly into {num_stages} stages x "
                         f"{chunks} chunks: n_layers must be a multiple of {parts}")


def layer_ranges(n_layers: int, num_stages: int, chunks: int = 1, layers=None) -> list[range]:
    """The blocks of each virtual stage, in order: ``n_layers / (num_stages * chunks)`` each,
    or ``layers[s]`` blocks in virtual stage ``s``. Rank r's chunk c is virtual stage
    ``c * num_stages + r`` (:meth:`~.actions.Schedule.stage`)."""
    check_split(n_layers, num_stages, chunks, layers)
    parts = num_stages * chunks
    sizes = tuple(layers) if layers is not None else (n_layers // parts,) * parts
    starts = [sum(sizes[:s]) for s in range(parts + 1)]
    return [range(starts[s], starts[s + 1]) for s in range(parts)]


def split_gpt(gpt: GPT, num_stages: int, chunks: int = 1, layers=None) -> list[PipelineChunk]:
    """The model's virtual stages, in order (``num_stages * chunks`` of them): equal ones,
    or ``layers[s]`` blocks in virtual stage ``s`` (e.g. ``(1, 2, 2, 3)``)."""
    ranges = layer_ranges(gpt.cfg.n_layers, num_stages, chunks, layers)
    return [PipelineChunk(gpt, r, s == 0, s == len(ranges) - 1) for s, r in enumerate(ranges)]


def check_pipeline(cfg: GPTConfig, schedule: Schedule, batch_size: int, layers=None) -> None:
    """Every check that can be made before a process starts."""
    check_split(cfg.n_layers, schedule.num_stages, schedule.chunks, layers)
    m = schedule.microbatches
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, not {batch_size!r}")
    if batch_size % m:
        raise ValueError(f"a batch of {batch_size} does not divide into {m} equal "
                         f"micro-batches: batch_size must be a multiple of {m}")
