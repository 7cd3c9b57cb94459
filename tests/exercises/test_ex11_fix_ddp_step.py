"""ex11: the fixed data-parallel step keeps the replicas consistent and trains like one
process. Run against solutions/ by default; the grader points LECTURE_EXERCISE_PATH at a
student's file."""
import functools

import torch
import torch.distributed as dist

from lecture_lib.grading import assert_close_per_rank, load_exercise
from lecture_lib.models import (
    GPT,
    GPTConfig,
    MarkovText,
    TrainResult,
    make_optimizer,
    shard,
    train_reference,
)

ex = load_exercise("ex11")
POINTS = 10
CFG = GPTConfig(d_model=32, n_layers=2, seq_len=16, n_heads=2)
STEPS, BATCH, LR = 3, 8, 0.1


def _train():
    rank, size = dist.get_rank(), dist.get_world_size()
    data = MarkovText(CFG.vocab_size, CFG.seq_len)
    model = GPT(CFG)
    opt = make_optimizer(model.parameters(), "sgd", LR)
    losses, states = [], []
    for step in range(STEPS):
        x, y = shard(data.batch(step, BATCH), rank, size)
        losses.append(ex.train_step(model, opt, x, y))
        states.append({n: (None if p.grad is None else p.grad.clone(), p.detach().clone())
                       for n, p in model.named_parameters()})    # compared in the test
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return TrainResult(losses, params), states


def _first_difference(per_rank: list, rtol=1e-6, atol=1e-7):
    """As lecture_lib.debugging.check_gradient_consistency, here: the first parameter (the
    gradient before the value) whose replica differs from rank 0's by more than
    atol + rtol * max|rank 0's|, or None."""
    for name, (grad0, value0) in per_rank[0].items():
        for kind, i, ref in (("grad", 0, grad0), ("value", 1, value0)):
            ref = torch.zeros_like(value0) if ref is None else ref
            for rank, state in enumerate(per_rank[1:], 1):
                t = state[name][i]
                t = torch.zeros_like(value0) if t is None else t
                limit = atol + rtol * ref.abs().max().item()
                if (t - ref).abs().max().item() > limit:
                    return f"{name} {kind} differs on rank {rank}"
    return None


@functools.lru_cache(maxsize=None)
def results():
    return ex.run(_train, 2, timeout=60)


def _reference():
    data = MarkovText(CFG.vocab_size, CFG.seq_len)
    return train_reference(GPT(CFG), lambda s: data.batch(s, BATCH), STEPS, lr=LR,
                           optimizer="sgd")


def test_replicas_stay_consistent_after_every_step():
    per_rank = [states for _, states in results()]
    findings = [_first_difference([r[step] for r in per_rank]) for step in range(STEPS)]
    assert findings == [None] * STEPS, f"after each step: {findings}"


def test_parameters_equal_one_process_training():
    """Same parameters as one process on the whole batch, rtol 1e-5, atol 1e-6 (SGD)."""
    ref = _reference()
    assert_close_per_rank([got.params for got, _ in results()], ref.params,
                          "the parameters after training (against one process)",
                          rtol=1e-5, atol=1e-6)


def test_returned_loss_is_the_global_batch_loss_on_every_rank():
    ref = _reference()
    runs = results()
    assert_close_per_rank([got.losses for got, _ in runs], [list(ref.losses)] * len(runs),
                          "the returned losses (the global batch's, in one process)",
                          rtol=1e-5, atol=1e-6)
    (a, _), (b, _) = results()
    assert a.losses == b.losses, f"rank 0 returned {a.losses}, rank 1 returned {b.losses}"
