"""Tensor parallelism: one layer's matrices split across ranks (Megatron-LM).

The idea
--------
A linear layer computes ``Y = X W``. Split ``W`` by **columns**,
``W = [W_1 | W_2]``, and each rank computes its own columns of ``Y``:
``Y_i = X W_i`` (the results are *concatenated*). Split ``W`` by **rows**
(and ``X`` by columns to match) and each rank computes a partial product,
``Y = X_1 W_1 + X_2 W_2`` (the results are *summed*). Megatron-LM
(Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language
Models Using Model Parallelism", arXiv:1909.08053) chains the two: a
column-parallel layer, then an element-wise activation on the split
columns, then a row-parallel layer. The pair communicates only at its edges,
through two conjugate operators:

* ``f`` (:func:`copy_to_tensor_parallel`): identity forward, all-reduce backward;
* ``g`` (:func:`reduce_from_tensor_parallel`): all-reduce forward, identity backward.

So an MLP costs one all-reduce forward and one backward; attention is split
by heads the same way (q, k, v by columns, the output projection by rows).
The embedding and the loss are split over the vocabulary so that no rank
ever holds the full logits (:class:`VocabParallelEmbedding`,
:func:`vocab_parallel_cross_entropy`). **Sequence parallelism** (Korthikanti
et al. 2022, arXiv:2205.05198) replaces each all-reduce by a reduce-scatter
(forward, leaving the sequence split) and an all-gather (entering the next
split layer), so the layer norms and residuals work on ``1/tp`` of the tokens.

Every layer takes ``group=`` (default: the world), so the hybrid lecture can
use it on the tp axis of a :class:`~lecture_lib.mesh.RankGrid`. Weights come
from one full layer built from a seed and then split (as picotron does), so a
parallel layer equals its one-device original. Every collective goes through
one function that counts it (:func:`count_comm`): the bytes per block are
*counted*, then compared with :mod:`lecture_lib.costmodel.tensor_parallel`.
"""
from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from . import models
from .costmodel.comm import bus_factor
from .launch import device as rank_device
from .launch import run
from .metrics import saved_tensor_bytes, wall_time

# ----------------------------------------------------------------------------
# Counting communication
# ----------------------------------------------------------------------------


@dataclass
class CommRecord:
    kind: str            # "all_reduce", "all_gather", "reduce_scatter"
    phase: str           # "forward", "backward" or "grads"
    nbytes: int          # costmodel.comm's convention: the full buffer
    group_size: int
    seconds: float


@dataclass
class CommCounter:
    """Every collective the tensor-parallel operators ran inside :func:`count_comm`."""
    records: list = field(default_factory=list)

    def _select(self, phase=None, kind=None):
        return [r for r in self.records if (phase is None or r.phase == phase)
                and (kind is None or r.kind == kind)]

    def calls(self, phase=None, kind=None) -> int:
        return len(self._select(phase, kind))

    def buffer_bytes(self, phase=None, kind=None) -> int:
        return sum(r.nbytes for r in self._select(phase, kind))

    def sent_bytes(self, phase=None, kind=None) -> float:
        """Bytes one rank sends over the wire with ring collectives (bus_factor x buffer)."""
        return sum(r.nbytes * bus_factor(r.kind, r.group_size) for r in self._select(phase, kind))

    def seconds(self, phase=None, kind=None) -> float:
        return sum(r.seconds for r in self._select(phase, kind))

    def summary(self) -> dict:
        """``{phase: {kind: (calls, buffer bytes)}}``, the shape of ``costmodel.tp_block_comm``."""
        out = {}
        for r in self.records:
            calls, nbytes = out.setdefault(r.phase, {}).get(r.kind, (0, 0))
            out[r.phase][r.kind] = (calls + 1, nbytes + r.nbytes)
        return out


_ACTIVE: list[CommCounter] = []
# torch 2.13 renamed the single-tensor collectives; older torch has the old names only.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@contextmanager
def count_comm():
    """``with count_comm() as c: ...`` records every tensor-parallel collective on this rank."""
    counter = CommCounter()
    _ACTIVE.append(counter)
    try:
        yield counter
    finally:
        _ACTIVE.remove(counter)


def _size(group) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def _rank(group) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def _collective(kind: str, phase: str, x: torch.Tensor, group, dim: int = -1,
                op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Run one collective on ``x`` (a new tensor comes back) and record it."""
    p = _size(group)
    if p == 1:                                       # nothing to talk about
        return x.clone()
    x = x.contiguous()
    with wall_time(x.device) as t:
        if kind == "all_reduce":
            out = x.clone()
            dist.all_reduce(out, op=op, group=group)
            nbytes = out.numel() * out.element_size()
        elif kind == "all_gather":                   # concatenate along dim
            front = x.movedim(dim, 0).contiguous()
            out = front.new_empty((p * front.shape[0],) + front.shape[1:])
            _all_gather_single(out, front, group=group)
            out = out.movedim(0, dim).contiguous()
            nbytes = out.numel() * out.element_size()
        elif kind == "reduce_scatter":               # sum, then keep my chunk of dim
            front = x.movedim(dim, 0).contiguous()
            out = front.new_empty((front.shape[0] // p,) + front.shape[1:])
            _reduce_scatter_single(out, front, group=group)
            out = out.movedim(0, dim).contiguous()
            nbytes = x.numel() * x.element_size()
        else:
            raise ValueError(f"unknown collective {kind!r}")
    for counter in _ACTIVE:
        counter.records.append(CommRecord(kind, phase, nbytes, p, t.seconds))
    return out


def _split(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    p = _size(group)
    if x.shape[dim] % p:
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} is not divisible by "
                         f"tensor-parallel size {p}")
    return x.chunk(p, dim)[_rank(group)].contiguous()


# ----------------------------------------------------------------------------
# Megatron's conjugate operators (autograd Functions)
# ----------------------------------------------------------------------------

def _operator(name: str, forward, backward, doc: str):
    """An autograd Function: ``forward(x, group, dim)`` forward, ``backward(grad, group, dim)``
    backward. Each pair below is one of Megatron's conjugate operators."""
    def fwd(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return forward(x, group, dim)

    def bwd(ctx, grad):
        return backward(grad, ctx.group, ctx.dim), None, None

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(fwd), "backward": staticmethod(bwd), "__doc__": doc,
        "__module__": __name__})


def _identity(x, group, dim):
    return x


def _comm(kind: str, phase: str):
    return lambda x, group, dim: _collective(kind, phase, x, group, dim)


_CopyToTP = _operator("_CopyToTP", _identity, _comm("all_reduce", "backward"),
                      "f: identity forward; all-reduce the gradient backward.")
_ReduceFromTP = _operator("_ReduceFromTP", _comm("all_reduce", "forward"), _identity,
                          "g: all-reduce forward; identity backward.")
_GatherFromTP = _operator("_GatherFromTP", _comm("all_gather", "forward"), _split,
                          "All-gather along dim forward; keep my slice of the gradient backward.")
_SplitToTP = _operator("_SplitToTP", _split, _comm("all_gather", "backward"),
                       "Keep my slice along dim forward; all-gather the gradient backward.")
_ReduceScatterToSP = _operator("_ReduceScatterToSP", _comm("reduce_scatter", "forward"),
                               _comm("all_gather", "backward"),
                               "Sequence parallel g-bar: reduce-scatter forward; all-gather backward.")
_AllGatherFromSP = _operator("_AllGatherFromSP", _comm("all_gather", "forward"),
                             _comm("reduce_scatter", "backward"),
                             "Sequence parallel g: all-gather forward; reduce-scatter backward.")


def copy_to_tensor_parallel(x, group=None):
    """Megatron's f: identity forward, all-reduce backward."""
    return x if _size(group) == 1 else _CopyToTP.apply(x, group, -1)


def reduce_from_tensor_parallel(x, group=None):
    """Megatron's g: all-reduce forward, identity backward."""
    return x if _size(group) == 1 else _ReduceFromTP.apply(x, group, -1)


def gather_from_tensor_parallel(x, group=None, dim: int = -1):
    """All-gather along ``dim`` forward (concatenate the column splits); split backward."""
    return x if _size(group) == 1 else _GatherFromTP.apply(x, group, dim)


def split_to_tensor_parallel(x, group=None, dim: int = -1):
    """Keep this rank's slice along ``dim`` forward; all-gather backward."""
    return x if _size(group) == 1 else _SplitToTP.apply(x, group, dim)


def reduce_scatter_to_sequence_parallel(x, group=None, dim: int = 1):
    """Sum the partial results and keep this rank's part of the sequence; all-gather backward."""
    return x if _size(group) == 1 else _ReduceScatterToSP.apply(x, group, dim)


def all_gather_from_sequence_parallel(x, group=None, dim: int = 1):
    """Gather the whole sequence forward; reduce-scatter the gradient backward."""
    return x if _size(group) == 1 else _AllGatherFromSP.apply(x, group, dim)


# ----------------------------------------------------------------------------
# Column- and row-parallel linear layers
# ----------------------------------------------------------------------------

def _check_divisible(layer: str, what: str, n: int, tp: int) -> None:
    if n % tp:
        raise ValueError(f"{layer}: {what}={n} is not divisible by tensor-parallel size {tp}")


def seeded_linear(in_features: int, out_features: int, bias: bool = True, seed: int = 0):
    """A full ``nn.Linear`` whose weights depend on the seed only (the layer every rank splits)."""
    g = torch.Generator().manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) / math.sqrt(in_features))
        if bias:
            layer.bias.copy_(torch.randn(out_features, generator=g) * 0.1)
    return layer


def _param(t: torch.Tensor, tp_dim: int | None) -> nn.Parameter:
    """A parameter on this rank's device; ``tp_dim`` says along which dim it is split."""
    p = nn.Parameter(t.detach().clone().contiguous().to(rank_device()))
    p.tp_dim = tp_dim
    return p


class ColumnParallelLinear(nn.Module):
    """``Y_i = X W_i``: this rank holds ``out_features / tp`` output columns.

    The input passes through f (or, under sequence parallelism, an all-gather
    of the sequence); ``gather_output=True`` concatenates the columns at the end.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gather_output: bool = False, group=None, seed: int = 0,
                 sequence_parallel: bool = False, _full: nn.Linear | None = None):
        super().__init__()
        tp = _size(group)
        _check_divisible("ColumnParallelLinear", "out_features", out_features, tp)
        full = _full if _full is not None else seeded_linear(in_features, out_features, bias, seed)
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        self.in_features, self.out_features = in_features, out_features
        rows = slice(_rank(group) * out_features // tp, (_rank(group) + 1) * out_features // tp)
        self.weight = _param(full.weight[rows], 0)
        self.bias = _param(full.bias[rows], 0) if full.bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, gather_output: bool = False,
                    sequence_parallel: bool = False):
        """This rank's columns of an existing full layer."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None,
                   gather_output, group, sequence_parallel=sequence_parallel, _full=linear)

    def enter(self, x):
        """What the input needs before the split matmul: f, or the sequence all-gather."""
        if self.sequence_parallel:
            return all_gather_from_sequence_parallel(x, self.group)
        return copy_to_tensor_parallel(x, self.group)

    def project(self, x):
        """The local matmul alone (on an input that has already entered)."""
        return F.linear(x, self.weight, self.bias)

    def forward(self, x):
        y = self.project(self.enter(x))
        return gather_from_tensor_parallel(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """``Y = sum_i X_i W_i``: this rank holds ``in_features / tp`` input rows.

    The input is already split (``input_is_parallel=True``, the output of a
    column-parallel layer) or is split here. The partial products are summed
    by g (or reduce-scattered along the sequence); the bias is added once, after.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 input_is_parallel: bool = True, group=None, seed: int = 0,
                 sequence_parallel: bool = False, _full: nn.Linear | None = None):
        super().__init__()
        tp = _size(group)
        _check_divisible("RowParallelLinear", "in_features", in_features, tp)
        full = _full if _full is not None else seeded_linear(in_features, out_features, bias, seed)
        self.group, self.input_is_parallel, self.sequence_parallel = (
            group, input_is_parallel, sequence_parallel)
        self.in_features, self.out_features = in_features, out_features
        cols = slice(_rank(group) * in_features // tp, (_rank(group) + 1) * in_features // tp)
        self.weight = _param(full.weight[:, cols], 1)
        self.bias = _param(full.bias, None) if full.bias is not None else None
        if self.bias is not None and sequence_parallel:
            self.bias.sequence_parallel_partial = True

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, input_is_parallel: bool = True,
                    sequence_parallel: bool = False):
        """This rank's rows (input features) of an existing full layer."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None,
                   input_is_parallel, group, sequence_parallel=sequence_parallel, _full=linear)

    def forward(self, x):
        if not self.input_is_parallel:
            x = split_to_tensor_parallel(x, self.group)
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel(y, self.group)
        else:
            y = reduce_from_tensor_parallel(y, self.group)
        return y + self.bias if self.bias is not None else y


# ----------------------------------------------------------------------------
# The parallel MLP, attention, embedding, loss and block
# ----------------------------------------------------------------------------

class ParallelMLP(nn.Module):
    """Column, GELU, row: one all-reduce forward (g) and one backward (f)."""

    def __init__(self, mlp: models.MLP, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.fc1 = ColumnParallelLinear.from_linear(mlp.fc1, group, sequence_parallel=sequence_parallel)
        self.fc2 = RowParallelLinear.from_linear(mlp.fc2, group, sequence_parallel=sequence_parallel)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelSelfAttention(nn.Module):
    """Causal attention with ``n_heads / tp`` heads per rank: q, k, v by columns, proj by rows."""

    def __init__(self, attn: models.CausalSelfAttention, group=None,
                 sequence_parallel: bool = False):
        super().__init__()
        _check_divisible("ParallelSelfAttention", "n_heads", attn.n_heads, _size(group))
        self.head_dim = attn.head_dim
        self.q, self.k, self.v = (ColumnParallelLinear.from_linear(
            lin, group, sequence_parallel=sequence_parallel) for lin in (attn.q, attn.k, attn.v))
        self.proj = RowParallelLinear.from_linear(attn.proj, group,
                                                  sequence_parallel=sequence_parallel)

    def forward(self, x):
        x = self.q.enter(x)                       # one f (or all-gather) for q, k and v
        b, t, _ = x.shape
        q, k, v = (lin.project(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, end)`` of the embedding table on each rank; partial lookups summed by g
    (or reduce-scattered along the sequence under sequence parallelism)."""

    def __init__(self, embedding: nn.Embedding, group=None, sequence_parallel: bool = False):
        super().__init__()
        tp, vocab = _size(group), embedding.num_embeddings
        _check_divisible("VocabParallelEmbedding", "vocab_size", vocab, tp)
        self.group, self.sequence_parallel = group, sequence_parallel
        self.start = _rank(group) * vocab // tp
        self.end = self.start + vocab // tp
        self.weight = _param(embedding.weight[self.start:self.end], 0)

    def forward(self, idx):
        outside = (idx < self.start) | (idx >= self.end)
        local = (idx - self.start).masked_fill(outside, 0)
        y = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel(y, self.group)
        return reduce_from_tensor_parallel(y, self.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy on logits split over the vocabulary (Megatron-LM, section 3).

    Three all-reduces of one number per token (the max, the sum of exponentials,
    the target's logit) replace gathering ``tokens x vocab`` logits.
    """

    @staticmethod
    def forward(ctx, logits, targets, group):
        vocab_local = logits.shape[-1]
        start = _rank(group) * vocab_local
        logits_max = _collective("all_reduce", "forward", logits.max(-1).values, group,
                                 op=dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)
        outside = (targets < start) | (targets >= start + vocab_local)
        local = (targets - start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        target_logit = _collective("all_reduce", "forward", target_logit, group)
        exp = shifted.exp()
        sum_exp = _collective("all_reduce", "forward", exp.sum(-1), group)
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, local, outside)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local, outside = ctx.saved_tensors
        grad = softmax.clone()
        one_hot = (~outside).to(grad.dtype).unsqueeze(-1)
        grad.scatter_add_(-1, local.unsqueeze(-1), -one_hot)
        return grad * grad_loss.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(logits_local, targets, group=None):
    """Per-token loss from this rank's slice of the logits (vocab split evenly, in rank order).

    ``vocab_parallel_cross_entropy(z_i, t).mean()`` equals
    ``F.cross_entropy(z, t)`` where ``z`` is the concatenation of the slices.
    """
    if logits_local.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits_local.shape)} and targets {tuple(targets.shape)} "
                         "must agree on every dimension but the last")
    return _VocabParallelCrossEntropy.apply(logits_local, targets, group)


def _replicated(module: nn.Module, sequence_parallel: bool) -> nn.Module:
    """A copy of ``module`` on every rank (layer norms, position embedding)."""
    out = copy.deepcopy(module).to(rank_device())
    for p in out.parameters():
        p.tp_dim = None
        if sequence_parallel:
            p.sequence_parallel_partial = True
    return out


class ParallelBlock(nn.Module):
    """A pre-norm transformer block with attention and MLP split across the group."""

    def __init__(self, block: models.Block, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.ln1 = _replicated(block.ln1, sequence_parallel)
        self.attn = ParallelSelfAttention(block.attn, group, sequence_parallel)
        self.ln2 = _replicated(block.ln2, sequence_parallel)
        self.mlp = ParallelMLP(block.mlp, group, sequence_parallel)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def check_tensor_parallel(cfg: models.GPTConfig, tp: int, sequence_parallel: bool = False) -> None:
    """Clear error, before any process starts, unless ``cfg`` splits evenly over ``tp`` ranks."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor-parallel size must be a whole number >= 1, not {tp!r}")
    for what, n in (("n_heads", cfg.n_heads), ("d_ff", cfg.d_ff), ("vocab_size", cfg.vocab_size),
                    ("d_model", cfg.d_model)):
        if n % tp:
            raise ValueError(f"{what}={n} is not divisible by tensor-parallel size {tp}")
    if sequence_parallel and cfg.seq_len % tp:
        raise ValueError(f"sequence parallelism: seq_len={cfg.seq_len} is not divisible by "
                         f"tensor-parallel size {tp}")


class TensorParallelGPT(nn.Module):
    """:class:`models.GPT` split over ``group``: same names, same maths, ``1/tp`` of the weights.

    ``model(idx)`` gives this rank's slice of the logits (``vocab / tp``
    columns; no rank holds them all); ``model(idx, targets)`` the mean loss,
    through :func:`vocab_parallel_cross_entropy`.
    """

    def __init__(self, gpt: models.GPT, group=None, sequence_parallel: bool = False):
        super().__init__()
        cfg = gpt.cfg
        check_tensor_parallel(cfg, _size(group), sequence_parallel)
        self.cfg, self.group, self.sequence_parallel = cfg, group, sequence_parallel
        self.tok_emb = VocabParallelEmbedding(gpt.tok_emb, group, sequence_parallel)
        self.pos_emb = _replicated(gpt.pos_emb, sequence_parallel)
        self.blocks = nn.ModuleList(ParallelBlock(b, group, sequence_parallel) for b in gpt.blocks)
        self.ln_f = _replicated(gpt.ln_f, sequence_parallel)
        self.head = ColumnParallelLinear.from_linear(gpt.head, group,
                                                     sequence_parallel=sequence_parallel)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        if self.sequence_parallel:                # this rank's part of the sequence
            pos = pos.chunk(_size(self.group))[_rank(self.group)]
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return vocab_parallel_cross_entropy(logits, targets, self.group).mean()


def sync_sequence_parallel_grads(model: nn.Module, group=None) -> None:
    """Sum, over the group, the gradients of replicated weights that saw only part of the
    sequence (layer norms, position embedding, row-parallel biases) under sequence parallelism."""
    if _size(group) == 1:
        return
    for p in model.parameters():
        if getattr(p, "sequence_parallel_partial", False) and p.grad is not None:
            p.grad.copy_(_collective("all_reduce", "grads", p.grad, group))


def gather_full(model: nn.Module, group=None, grads: bool = False) -> dict:
    """``{name: full tensor}`` of the parameters (or their gradients), split ones gathered."""
    out = {}
    for name, p in model.named_parameters():
        t = (p.grad if grads else p).detach()
        if getattr(p, "tp_dim", None) is not None and _size(group) > 1:
            parts = [torch.empty_like(t) for _ in range(_size(group))]
            dist.all_gather(parts, t.contiguous(), group=group)
            t = torch.cat(parts, p.tp_dim)
        out[name] = t.cpu().clone()
    return out


# ----------------------------------------------------------------------------
# Training equal to one process, and the measurements of notebook 04
# ----------------------------------------------------------------------------

def _data(cfg: models.GPTConfig, data_seed: int):
    return models.MarkovText(cfg.vocab_size, cfg.seq_len, data_seed)


def train_reference(cfg: models.GPTConfig, steps: int, batch_size: int = 8, seed: int = 0,
                    data_seed: int = 0, lr: float = 1e-2, optimizer: str = "adamw"):
    """The one-process run that :func:`train_tensor_parallel` must equal."""
    text = _data(cfg, data_seed)
    return models.train_reference(models.GPT(cfg, seed), lambda s: text.batch(s, batch_size),
                                  steps, lr, optimizer)


def train_on_rank(cfg: models.GPTConfig, steps: int, batch_size: int = 8, seed: int = 0,
                  data_seed: int = 0, lr: float = 1e-2, optimizer: str = "adamw",
                  sequence_parallel: bool = False, group=None) -> models.TrainResult:
    """Inside a rank: build the full GPT from the seed, split it, train; full params back."""
    dev = rank_device()
    model = TensorParallelGPT(models.GPT(cfg, seed), group, sequence_parallel)
    opt = models.make_optimizer(model.parameters(), optimizer, lr)
    text, losses = _data(cfg, data_seed), []
    for step in range(steps):
        x, y = (t.to(dev) for t in text.batch(step, batch_size))
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        sync_sequence_parallel_grads(model, group)
        opt.step()
        losses.append(loss.item())
    return models.TrainResult(losses, gather_full(model, group))


def train_tensor_parallel(cfg: models.GPTConfig, tp: int, steps: int, batch_size: int = 8,
                          seed: int = 0, data_seed: int = 0, lr: float = 1e-2,
                          optimizer: str = "adamw", sequence_parallel: bool = False,
                          timeout: float = 120) -> models.TrainResult:
    """Train the GPT split over ``tp`` ranks; rank 0's losses and the gathered parameters."""
    check_tensor_parallel(cfg, tp, sequence_parallel)
    models.make_optimizer([torch.zeros(1, requires_grad=True)], optimizer, lr)  # bad name: now
    results = run(train_on_rank, tp, cfg, steps, batch_size, seed, data_seed, lr, optimizer,
                  sequence_parallel, timeout=timeout)
    return results[0]


def measure_block(cfg: models.GPTConfig, batch_size: int, sequence_parallel: bool = False,
                  seed: int = 0, group=None) -> dict:
    """Inside a rank: one block's forward and backward, its collectives counted and its
    saved activations measured (bytes autograd keeps, parameters excluded)."""
    dev = rank_device()
    block = ParallelBlock(models.GPT(cfg, seed).blocks[0], group, sequence_parallel)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch_size, cfg.seq_len, cfg.d_model, generator=g).to(dev)
    if sequence_parallel:
        x = x.chunk(_size(group), 1)[_rank(group)].contiguous()
    x.requires_grad_(True)
    with count_comm() as counter:
        with saved_tensor_bytes() as saved:
            y = block(x)
        y.pow(2).sum().backward()
    return {"comm": counter.summary(), "sent_bytes": {ph: counter.sent_bytes(ph)
                                                      for ph in ("forward", "backward")},
            "activation_bytes": saved.activation_bytes(block)}


def measure_step(cfg: models.GPTConfig, batch_size: int, steps: int = 5, warmup: int = 2,
                 seed: int = 0, group=None) -> dict:
    """Inside a rank: median training-step time, the time in collectives, tokens/s."""
    dev = rank_device()
    model = TensorParallelGPT(models.GPT(cfg, seed), group)
    opt = models.make_optimizer(model.parameters(), "adamw")
    text = _data(cfg, 0)
    times, comm = [], []
    for step in range(warmup + steps):
        x, y = (t.to(dev) for t in text.batch(step, batch_size))
        with count_comm() as counter, wall_time(dev) as t:
            opt.zero_grad(set_to_none=True)
            model(x, y).backward()
            opt.step()
        if step >= warmup:
            times.append(t.seconds)
            comm.append(counter.seconds())
    order = sorted(range(steps), key=times.__getitem__)
    mid = order[steps // 2]
    return {"step_s": times[mid], "comm_s": comm[mid], "comm_share": comm[mid] / times[mid],
            "tokens_per_s": batch_size * cfg.seq_len / times[mid]}


def compare_with_dtensor(d_model: int, d_ff: int, tokens: int, steps: int = 5,
                         seed: int = 0) -> dict:
    """Inside a rank (world group): our ParallelMLP and torch's DTensor tensor parallelism
    (``parallelize_module`` with ColwiseParallel / RowwiseParallel) on one MLP.

    Returns both outputs and input gradients (full, on every rank) and the
    median forward+backward time of each, measured alternately in one run.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    dev = rank_device()
    cfg = models.GPTConfig(d_model=d_model, d_ff=d_ff, n_heads=1, n_layers=1)
    full = models.GPT(cfg, seed).blocks[0].mlp
    ours = ParallelMLP(full)
    theirs = copy.deepcopy(full).to(dev)
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    parallelize_module(theirs, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, d_model, generator=g).to(dev)

    def step(module):
        xi = x.clone().requires_grad_(True)
        y = module(xi)
        y.pow(2).sum().backward()
        return y.detach(), xi.grad

    out = {}
    times = {"ours": [], "dtensor": []}
    for i in range(steps + 1):
        for name, module in (("ours", ours), ("dtensor", theirs)):
            module.zero_grad(set_to_none=True)
            with wall_time(dev) as t:
                y, gx = step(module)
            if i:                                 # the first step warms up
                times[name].append(t.seconds)
            out[name] = (y.cpu(), gx.cpu())
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {"ours": out["ours"], "dtensor": out["dtensor"], "ours_s": med["ours"],
            "dtensor_s": med["dtensor"], "ratio": med["dtensor"] / med["ours"]}
