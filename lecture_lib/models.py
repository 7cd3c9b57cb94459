"""The models and data every lecture trains, and the one-process reference.

* :class:`GPT`: a small decoder-only transformer in the style of nanoGPT
  (token + position embeddings, pre-norm blocks of causal self-attention and
  an MLP, a final layer norm, a language-model head). Its weights come from a
  seed through one ``torch.Generator``, so every rank and the one-process
  reference build *identical* weights without communicating.
* :class:`ToyMLP`: a stack of linear layers for the smallest experiments.
* :class:`MarkovText`: a synthetic but learnable language: each token is
  followed by one of a few likely successors. The loss falls from
  ``ln(vocab)`` towards the chain's entropy within a few dozen CPU steps.
  Batch ``k`` is a pure function of ``(seed, k)``, so any rank can build the
  global batch and take its shard.
* :func:`train_reference` trains on one process; :func:`assert_same_training`
  is the check every parallel scheme must pass ("equal to one process").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------
# The small GPT
# ----------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64
    seq_len: int = 32
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 0            # 0 means 4 * d_model
    n_kv_heads: int = 0      # grouped-query attention's key/value heads; 0 means n_heads
    mlp: str = "gelu"        # "gelu" (GPT) or "swiglu" (Llama: gate, up and down projections)

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1, not {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_ff == 0:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        if self.n_kv_heads == 0:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"GPTConfig.mlp must be 'gelu' or 'swiglu', not {self.mlp!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def num_params(self, embeddings: bool = True) -> int:
        """Parameters of :class:`GPT` with this shape (``embeddings=False``: without the token
        and position embeddings, Kaplan et al.'s N; the output layer is not tied)."""
        h, kv = self.d_model, self.n_kv_heads * self.head_dim
        attn = 2 * (h * h + h) + 2 * (h * kv + kv)
        mlp = (3 if self.mlp == "swiglu" else 2) * h * self.d_ff + self.d_ff * (
            2 if self.mlp == "swiglu" else 1) + h
        block = attn + mlp + 4 * h
        body = self.n_layers * block + 2 * h + self.vocab_size * h
        return body + (self.vocab_size + self.seq_len) * h if embeddings else body


#: Models of real size, for the dry run (fake tensors: timed, never computed). One
#: description each, shared by every experiment, the capstone and the cost model.
REAL_SIZE = {
    # Radford et al. 2019; the vocabulary padded to 50304 as llm.c does (a multiple of 128)
    "GPT-2 small": GPTConfig(vocab_size=50304, seq_len=1024, d_model=768, n_heads=12,
                             n_layers=12),
    "GPT-2 medium": GPTConfig(vocab_size=50304, seq_len=1024, d_model=1024, n_heads=16,
                              n_layers=24),
    # Brown et al. 2020, Table 2.1
    "GPT-3 175B": GPTConfig(vocab_size=50257, seq_len=2048, d_model=12288, n_heads=96,
                            n_layers=96),
    # Llama 3 (Dubey et al. 2024, Table 3): GQA with 8 key/value heads, SwiGLU; RMSNorm and
    # RoPE are not modelled (elementwise, no matmul and no communication: < 1% of a step)
    "Llama 3 8B": GPTConfig(vocab_size=128256, seq_len=8192, d_model=4096, n_heads=32,
                            n_layers=32, d_ff=14336, n_kv_heads=8, mlp="swiglu"),
    "Llama 3 70B": GPTConfig(vocab_size=128256, seq_len=8192, d_model=8192, n_heads=64,
                             n_layers=80, d_ff=28672, n_kv_heads=8, mlp="swiglu"),
}


def real_size(name: str, **changes) -> GPTConfig:
    """One of :data:`REAL_SIZE`, with fields changed (``n_layers=2``, ``seq_len=4096``)."""
    if name not in REAL_SIZE:
        raise ValueError(f"unknown model {name!r}; one of {', '.join(REAL_SIZE)}")
    base = REAL_SIZE[name]
    if "d_model" in changes and "d_ff" not in changes and base.d_ff == 4 * base.d_model:
        changes["d_ff"] = 0                        # still 4 x the new width
    if "n_heads" in changes and "n_kv_heads" not in changes and base.n_kv_heads == base.n_heads:
        changes["n_kv_heads"] = 0                  # still one key/value head per query head
    return replace(base, **changes)


class CausalSelfAttention(nn.Module):
    """Multi-head attention; q, k, v kept as separate projections (easy to split by heads).
    With grouped-query attention (``n_kv_heads < n_heads``) k and v have fewer heads, each
    shared by ``n_heads / n_kv_heads`` query heads."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        kv = cfg.n_kv_heads * cfg.head_dim
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.k = nn.Linear(cfg.d_model, kv)
        self.v = nn.Linear(cfg.d_model, kv)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        y = attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


def attention(q, k, v):
    """Causal attention of q (b, heads, t, d) over k, v (b, kv heads, t, d); each key/value
    head serves ``heads / kv heads`` query heads (grouped-query attention)."""
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class MLP(nn.Module):
    """GPT's ``fc2(gelu(fc1(x)))``, or Llama's SwiGLU ``fc2(silu(gate(x)) * fc1(x))``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff) if cfg.mlp == "swiglu" else None
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x):
        if self.gate is None:
            return self.fc2(F.gelu(self.fc1(x)))
        return self.fc2(F.silu(self.gate(x)) * self.fc1(x))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.d_model), CausalSelfAttention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.d_model), MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """``GPT(cfg, seed)(idx)`` gives logits; ``GPT(...)(idx, targets)`` gives the mean loss."""

    def __init__(self, cfg: GPTConfig = GPTConfig(), seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, seed)

    def embed(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok_emb(idx) + self.pos_emb(pos)

    def logits(self, x):
        return self.head(self.ln_f(x))

    def forward(self, idx, targets=None):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.logits(x)
        return logits if targets is None else lm_loss(logits, targets)


def lm_loss(logits, targets):
    """Mean next-token cross-entropy over every position of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def init_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """GPT-2 style init from one generator: identical on every process for one seed.

    Weights ~ N(0, std) (output projections scaled by 1/sqrt(2 * layers), as in
    GPT-2), biases 0, layer-norm scales 1. Parameters are visited in
    ``named_parameters`` order, so the result depends only on the seed.
    """
    g = torch.Generator().manual_seed(seed)
    n_layers = getattr(getattr(model, "cfg", None), "n_layers", 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:                           # layer-norm scale
                p.fill_(1.0)
            else:
                residual = name.endswith(("proj.weight", "fc2.weight"))
                s = std / math.sqrt(2 * n_layers) if residual else std
                p.copy_(torch.randn(p.shape, generator=g) * s)


# ----------------------------------------------------------------------------
# The toy MLP
# ----------------------------------------------------------------------------

class ToyMLP(nn.Module):
    """Linear layers with ReLU between them; ``ToyMLP((16, 32, 4), seed)``."""

    def __init__(self, sizes=(16, 64, 64, 8), seed: int = 0):
        super().__init__()
        if len(sizes) < 2 or min(sizes) < 1:
            raise ValueError(f"sizes must list at least two positive widths, not {sizes}")
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in self.layers:
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=g)
                                   / math.sqrt(layer.in_features))
                layer.bias.zero_()

    def forward(self, x, targets=None):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x if targets is None else F.mse_loss(x, targets)


def regression_batch(step: int, batch_size: int, sizes=(16, 64, 64, 8), seed: int = 0):
    """Inputs and targets of a fixed random linear teacher; batch ``step`` is reproducible."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(sizes[0], sizes[-1], generator=g) / math.sqrt(sizes[0])
    g.manual_seed(seed * 1_000_003 + step + 1)
    x = torch.randn(batch_size, sizes[0], generator=g)
    return x, x @ teacher


# ----------------------------------------------------------------------------
# Synthetic, learnable text
# ----------------------------------------------------------------------------

@dataclass
class MarkovText:
    """Token sequences from a sparse random Markov chain (``successors`` likely next tokens)."""

    vocab_size: int = 64
    seq_len: int = 32
    seed: int = 0
    successors: int = 3
    transition: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        if self.vocab_size < 2 or self.seq_len < 1:
            raise ValueError("MarkovText needs vocab_size >= 2 and seq_len >= 1")
        g = torch.Generator().manual_seed(self.seed)
        k = min(self.successors, self.vocab_size)
        probs = torch.full((self.vocab_size, self.vocab_size), 0.02 / self.vocab_size)
        for tok in range(self.vocab_size):
            nxt = torch.randperm(self.vocab_size, generator=g)[:k]
            probs[tok, nxt] += torch.softmax(torch.randn(k, generator=g), 0) * 0.98
        self.transition = probs / probs.sum(1, keepdim=True)

    def entropy(self) -> float:
        """The best achievable loss (nats/token) under the chain's stationary mix, roughly."""
        p = self.transition
        return float(-(p * p.log()).sum(1).mean())

    def batch(self, step: int, batch_size: int):
        """``(inputs, targets)`` of shape ``(batch_size, seq_len)``; a function of (seed, step)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 1)
        seq = torch.empty(batch_size, self.seq_len + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(self.vocab_size, (batch_size,), generator=g)
        for t in range(self.seq_len):
            seq[:, t + 1] = torch.multinomial(self.transition[seq[:, t]], 1, generator=g)[:, 0]
        return seq[:, :-1], seq[:, 1:]


def shard(batch, rank: int, world_size: int):
    """This rank's contiguous slice of every tensor in ``batch`` (split on dim 0)."""
    n = batch[0].shape[0]
    if n % world_size:
        raise ValueError(f"batch of {n} is not divisible by {world_size} ranks")
    size = n // world_size
    return tuple(t[rank * size:(rank + 1) * size] for t in batch)


# ----------------------------------------------------------------------------
# The one-process reference and the equality check
# ----------------------------------------------------------------------------

@dataclass
class TrainResult:
    losses: list[float]
    params: dict[str, torch.Tensor]


def make_optimizer(params, name: str = "adamw", lr: float = 1e-2):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"optimizer must be 'adamw' or 'sgd', not {name!r}")


def train_reference(model: nn.Module, batches, steps: int, lr: float = 1e-2,
                    optimizer: str = "adamw") -> TrainResult:
    """Train ``model`` in this process on ``batches(step) -> (x, y)``; return losses and params."""
    opt = make_optimizer(model.parameters(), optimizer, lr)
    losses = []
    for step in range(steps):
        x, y = batches(step)
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return TrainResult(losses, {k: v.detach().clone() for k, v in model.named_parameters()})


def assert_same_training(got: TrainResult, expected: TrainResult, rtol: float = 1e-5,
                         atol: float = 1e-6) -> None:
    """Raise AssertionError naming the first loss or parameter that differs beyond tolerance."""
    if len(got.losses) != len(expected.losses):
        raise AssertionError(f"{len(got.losses)} losses, expected {len(expected.losses)}")
    for step, (a, b) in enumerate(zip(got.losses, expected.losses)):
        if not math.isclose(a, b, rel_tol=rtol, abs_tol=atol):
            raise AssertionError(f"loss at step {step}: {a!r} vs one-process {b!r} "
                                 f"(rel. diff {abs(a - b) / max(abs(b), 1e-30):.2e} > {rtol:g})")
    missing = set(expected.params) ^ set(got.params)
    if missing:
        raise AssertionError(f"parameters present on one side only: {sorted(missing)}")
    for name, ref in expected.params.items():
        val = got.params[name]
        if val.shape != ref.shape:
            raise AssertionError(f"{name}: shape {tuple(val.shape)} vs {tuple(ref.shape)}")
        if not torch.allclose(val.float(), ref.float(), rtol=rtol, atol=atol):
            diff = (val.float() - ref.float()).abs().max().item()
            raise AssertionError(f"parameter {name} differs from one-process training: "
                                 f"max abs diff {diff:.3e} (rtol {rtol:g}, atol {atol:g})")
