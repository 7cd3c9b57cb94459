"""capstone.generate: a prompt continued token by token, seeded, within the model's context."""
import pytest
import torch
import torch.nn as nn

from lecture_lib.capstone.generate import sample, sample_ids
from lecture_lib.models import GPT, GPTConfig


class Always(nn.Module):
    """A 'model' whose next token is always ``token`` (and which records what it saw)."""

    def __init__(self, vocab: int, token: int, seq_len: int = 4):
        super().__init__()
        self.vocab, self.token, self.seen = vocab, token, []
        self.cfg = GPTConfig(vocab_size=vocab, seq_len=seq_len)

    def forward(self, idx):
        self.seen.append(idx.shape[1])
        logits = torch.full((1, idx.shape[1], self.vocab), -1e9)
        logits[..., self.token] = 0.0
        return logits


class Chars:
    """A tokenizer of single characters 'a'..'z' (ids 0..25), the tokenizers API's shape."""

    class Encoding:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, text):
        return self.Encoding([ord(c) - ord("a") for c in text])

    def decode(self, ids):
        return "".join(chr(ord("a") + i) for i in ids)


def test_a_certain_model_continues_the_prompt_with_its_token_within_its_context():
    model = Always(26, token=25, seq_len=4)
    assert sample(model, Chars(), "abc", 5) == "abczzzzz"
    assert max(model.seen) == 4                   # never more than the context


def test_one_seed_gives_one_text_and_another_seed_another():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=26, seq_len=8, d_model=16, n_heads=2, n_layers=1), seed=1)
    a, b = (sample_ids(model, [0, 1], 20, 8, seed=s, temperature=2.0) for s in (0, 0))
    c = sample_ids(model, [0, 1], 20, 8, seed=1, temperature=2.0)
    assert a == b and a != c and len(a) == 22 and a[:2] == [0, 1]
    assert model.training                          # sample_ids leaves the mode alone
    sample(model, Chars(), "ab", 3)
    assert model.training                          # sample restores it


@pytest.mark.parametrize("prompt,new_tokens,temperature,message", [
    ("", 3, 1.0, "prompt"), ("ab", 0, 1.0, "new_tokens"), ("ab", 2.5, 1.0, "new_tokens"),
    ("ab", 3, 0.0, "temperature"), ("ab", 3, "hot", "temperature")])
def test_bad_arguments_are_refused_before_the_model_runs(prompt, new_tokens, temperature, message):
    model = Always(26, token=0)
    with pytest.raises(ValueError, match=message):
        sample(model, Chars(), prompt, new_tokens, temperature=temperature)
    assert model.seen == []
