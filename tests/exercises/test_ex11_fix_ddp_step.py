"""ex11: the fixed data-parallel step keeps the replicas consistent and trains like one
process. Run against solutions/ by default; the grader points LECTURE_EXERCISE_PATH at a
student's file.

On 3 ranks (inspect_train_step uses 2): a step that divides by 2 rather than by the world
size trains like one process only there. One test per cause (the replicas, the update, the
loss), so fixing one bug of three earns a third."""
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
STEPS, BATCH, LR = 3, 12, 0.1
WORLD = 3


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
    return ex.run(_train, WORLD, timeout=90)


def _reference():
    data = MarkovText(CFG.vocab_size, CFG.seq_len)
    return train_reference(GPT(CFG), lambda s: data.batch(s, BATCH), STEPS, lr=LR,
                           optimizer="sgd")


def test_replicas_stay_consistent_after_every_step():
    per_rank = [states for _, states in results()]
    findings = [_first_difference([r[step] for r in per_rank]) for step in range(STEPS)]
    assert findings == [None] * STEPS, (
        "after each step every replica must hold the same gradients and the same values (as "
        f"check_gradient_consistency checks); the first that differs, step by step: {findings}")


def _first_gradients():
    """One process's gradients of the first step, on the whole batch."""
    data = MarkovText(CFG.vocab_size, CFG.seq_len)
    model = GPT(CFG)
    model(*data.batch(0, BATCH)).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def _gradient_ratios(per_rank_states):
    """For each rank, the first parameter whose gradient after the first step's sync is not
    one process's, and its size against one process's (a ratio of norms)."""
    ref, out = _first_gradients(), []
    for states in per_rank_states:
        for name, (grad, _) in states[0].items():
            grad = torch.zeros_like(ref[name]) if grad is None else grad
            if not torch.allclose(grad, ref[name], rtol=1e-4, atol=1e-6):
                out.append(f"rank {len(out)}: its gradient of {name} is "
                           f"{(grad.norm() / ref[name].norm()).item():.3g} times one process's")
                break
        else:
            out.append(f"rank {len(out)}: its gradients are one process's")
    return "; ".join(out)


def test_parameters_equal_one_process_training():
    """Same parameters as one process on the whole batch, rtol 1e-5, atol 1e-6 (SGD)."""
    ref = _reference()
    try:
        assert_close_per_rank([got.params for got, _ in results()], ref.params,
                              "the parameters after training (against one process)",
                              rtol=1e-5, atol=1e-6)
    except AssertionError as e:
        raise AssertionError(
            f"after {STEPS} SGD steps on {WORLD} ranks the parameters are not one process's on "
            "the whole batch. After the first step's sync: "
            f"{_gradient_ratios([states for _, states in results()])}. Every rank's update "
            "must be the whole batch's mean gradient's\n" + str(e)) from None


def test_returned_loss_is_the_global_batch_loss_on_every_rank():
    ref = _reference()
    runs = results()
    assert_close_per_rank([got.losses for got, _ in runs], [list(ref.losses)] * len(runs),
                          "the returned losses (the global batch's, in one process)",
                          rtol=1e-5, atol=1e-6)
    losses = [got.losses for got, _ in runs]
    assert all(x == losses[0] for x in losses), f"the ranks returned different losses: {losses}"
