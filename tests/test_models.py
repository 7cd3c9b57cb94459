"""models: deterministic init, learnable data, the reference loop and the equality check."""
import math

import pytest
import torch

import lecture_lib
from lecture_lib.models import (
    GPT,
    REAL_SIZE,
    GPTConfig,
    MarkovText,
    ToyMLP,
    TrainResult,
    assert_same_training,
    real_size,
    regression_batch,
    shard,
    train_reference,
)

SMALL = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=4, n_layers=2)


def test_same_seed_same_weights_in_every_process():
    def digest():
        return {k: v.sum().item() for k, v in GPT(SMALL, seed=3).state_dict().items()}
    here = digest()
    for rank_digest in lecture_lib.run(digest, 2, timeout=60):
        assert rank_digest == here
    other = {k: v.sum().item() for k, v in GPT(SMALL, seed=4).state_dict().items()}
    assert other != here


def test_gpt_shapes_and_loss_at_init_is_near_uniform():
    model, data = GPT(SMALL), MarkovText(SMALL.vocab_size, SMALL.seq_len)
    x, y = data.batch(0, 8)
    assert x.shape == y.shape == (8, 16)
    assert model(x).shape == (8, 16, 32)
    assert abs(model(x, y).item() - math.log(32)) < 0.1


def test_the_gpt_is_causal():
    model = GPT(SMALL)
    x = torch.randint(32, (1, 16))
    x2 = x.clone()
    x2[0, 10] = (x[0, 10] + 1) % 32
    torch.testing.assert_close(model(x)[0, :10], model(x2)[0, :10])
    assert not torch.allclose(model(x)[0, 10:], model(x2)[0, 10:])


def test_loss_falls_visibly_within_a_few_dozen_steps():
    data = MarkovText(SMALL.vocab_size, SMALL.seq_len)
    result = train_reference(GPT(SMALL), lambda s: data.batch(s, 16), 30, lr=1e-2)
    assert result.losses[-1] < result.losses[0] - 0.5
    assert data.entropy() < result.losses[-1]


def test_batches_are_reproducible_and_shardable():
    data = MarkovText(seed=1)
    a, b = data.batch(5, 4), data.batch(5, 4)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], data.batch(6, 4)[0])
    parts = [shard(a, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([p[0] for p in parts]), a[0])
    with pytest.raises(ValueError, match="not divisible"):
        shard(a, 0, 3)


def test_toy_mlp_learns_its_teacher():
    model = ToyMLP((8, 32, 4))
    res = train_reference(model, lambda s: regression_batch(s, 32, (8, 32, 4)), 60, lr=1e-2)
    assert res.losses[-1] < 0.3 * res.losses[0]


def test_assert_same_training_names_what_differs():
    data = MarkovText(SMALL.vocab_size, SMALL.seq_len)
    a = train_reference(GPT(SMALL), lambda s: data.batch(s, 4), 3)
    b = train_reference(GPT(SMALL), lambda s: data.batch(s, 4), 3)
    assert_same_training(a, b)
    bumped = dict(b.params)
    bumped["head.weight"] = b.params["head.weight"] + 1e-3
    with pytest.raises(AssertionError, match="head.weight"):
        assert_same_training(TrainResult(b.losses, bumped), a)
    with pytest.raises(AssertionError, match="loss at step 1"):
        bumped_loss = [a.losses[0], a.losses[1] * 1.01, a.losses[2]]
        assert_same_training(TrainResult(bumped_loss, a.params), a)


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=30, n_heads=4), "not divisible"),
    (dict(n_layers=0), "n_layers"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**kwargs)


def test_real_size_models_have_their_published_parameter_counts():
    billions = {name: cfg.num_params() / 1e9 for name, cfg in REAL_SIZE.items()}
    assert abs(billions["GPT-3 175B"] - 175) < 0.5                     # Brown et al. 2020
    llama_8b = billions["Llama 3 8B"] - 8192 * 4096 / 1e9             # Llama has no position table
    assert abs(llama_8b - 8.03) < 0.01 and abs(billions["Llama 3 70B"] - 70.6) < 0.1
    # GPT-2 small: 124M with the output layer tied to the embedding; ours is untied
    assert abs(REAL_SIZE["GPT-2 small"].num_params(embeddings=False) / 1e6 - 123.7) < 0.1
    assert real_size("GPT-3 175B", n_layers=2).n_layers == 2
    with pytest.raises(ValueError, match="unknown model"):
        real_size("GPT-5")


@pytest.mark.parametrize("changes", [dict(n_kv_heads=2), dict(mlp="swiglu"),
                                     dict(n_kv_heads=1, mlp="swiglu", d_ff=96)])
def test_gqa_and_swiglu_count_their_parameters(changes):
    cfg = GPTConfig(**changes)
    assert sum(p.numel() for p in GPT(cfg).parameters()) == cfg.num_params()
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    assert GPT(cfg)(x, x).isfinite()


def test_bad_gqa_or_mlp_is_refused():
    with pytest.raises(ValueError, match="must divide"):
        GPTConfig(n_kv_heads=3)
    with pytest.raises(ValueError, match="gelu"):
        GPTConfig(mlp="relu")
