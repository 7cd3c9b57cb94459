"""Cross-entropy on logits split over the vocabulary (Megatron-LM, section 3).

The output layer is column-parallel, so rank ``i`` holds the logits of
vocabulary entries ``[i V/tp, (i+1) V/tp)`` for every token and no rank holds
them all. The loss ``log sum_v exp(z_v) - z_target`` needs only three numbers
per token from the other ranks: the maximum (for a stable softmax), the sum
of exponentials and the target's logit (which lives on one rank only). Three
all-reduces of ``tokens`` numbers replace gathering ``tokens x V`` logits
(Shoeybi et al. 2019, arXiv:1909.08053). The backward needs no communication:
``softmax - one_hot(target)`` on this rank's columns.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import comm
from .comm import all_reduce


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss from this rank's slice of the logits; softmax - one-hot backward."""

    @staticmethod
    def forward(ctx, logits, targets, group):
        vocab_local = logits.shape[-1]
        start = comm.group_info(group)[0] * vocab_local
        logits_max = all_reduce(logits.max(-1).values, group, "forward", op=dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)
        outside = (targets < start) | (targets >= start + vocab_local)
        local = (targets - start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1)
        target_logit = all_reduce(target_logit.masked_fill(outside, 0.0), group, "forward")
        exp = shifted.exp()
        sum_exp = all_reduce(exp.sum(-1), group, "forward")
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
    return VocabParallelCrossEntropy.apply(logits_local, targets, group)


def vocab_parallel_lm_loss(logits_local, targets, group=None):
    """:func:`lecture_lib.models.lm_loss` on logits split over the vocabulary: the mean
    next-token cross-entropy over every position of the batch."""
    return vocab_parallel_cross_entropy(logits_local, targets, group).mean()
