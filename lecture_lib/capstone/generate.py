"""Text from a trained GPT: sample the next token, append it, repeat.

:func:`sample` is how the capstone shows what its model learned: it continues a prompt one
token at a time, each drawn from the model's softmax over the vocabulary at ``temperature``
(below 1 sharpens it), from a seeded generator, so one seed gives one text on one machine.
The model sees at most its context, ``seq_len`` tokens, of what came before.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def check_sample(prompt: str, new_tokens: int, temperature: float) -> None:
    """A clear error for bad arguments, before anything is computed."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty string, not {prompt!r}")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise ValueError(f"new_tokens must be a whole number >= 1, not {new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, not {temperature!r}")


@torch.no_grad()
def sample_ids(model: nn.Module, ids: list[int], new_tokens: int, context: int,
               seed: int = 0, temperature: float = 0.8) -> list[int]:
    """``ids`` continued by ``new_tokens`` ids drawn from ``model(ids)``'s last position."""
    generator = torch.Generator().manual_seed(seed)
    out = list(ids)
    for _ in range(new_tokens):
        window = torch.tensor([out[-context:]])
        logits = model(window)[0, -1].float()
        probs = torch.softmax(logits / temperature, dim=-1)
        out.append(int(torch.multinomial(probs, 1, generator=generator)))
    return out


def sample(model: nn.Module, tokenizer, prompt: str, new_tokens: int, seed: int = 0,
           temperature: float = 0.8) -> str:
    """``prompt`` continued by ``new_tokens`` tokens of ``model`` (a course ``GPT``: its
    ``cfg.seq_len`` is the context), decoded by ``tokenizer`` (``tokenizers.Tokenizer``)."""
    check_sample(prompt, new_tokens, temperature)
    ids = tokenizer.encode(prompt).ids
    if not ids:
        raise ValueError(f"the tokenizer makes no token of the prompt {prompt!r}")
    was_training = model.training
    model.eval()
    try:
        out = sample_ids(model, ids, new_tokens, model.cfg.seq_len, seed, temperature)
    finally:
        model.train(was_training)
    return tokenizer.decode(out)
