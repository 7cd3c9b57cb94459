# Generated from solutions/ex11_fix_ddp_step.py by `python -m lecture_lib.grading stubs`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grading grade exercises/ex11_fix_ddp_step.py
"""Exercise 11: fix a buggy data-parallel training step.

``buggy_train_step`` below is one data-parallel step as a rank runs it: each
rank holds a full copy of the model and its own shard ``(x, y)`` of the
global batch, computes its gradients, synchronises them with the other
ranks, and steps its optimizer. It is wrong, and nothing crashes: training
with it on N ranks does not equal training the same model on the whole batch
in one process.

Find out why with the debugging tools, as notebook 09 does in its section
"The exercise's step, under the tools":

* ``lecture_lib.debugging.inspect_train_step(buggy_train_step)`` runs the
  step on 2 ranks and reports what it sees: whether the replicas still agree
  (``check_gradient_consistency`` names the first parameter that differs),
  how large each parameter's update is against one process's, and whether
  the returned loss is the global batch's;
* ``lecture_lib.debugging.check_gradient_consistency(model)`` on every rank,
  after your sync or after the optimizer step, to check a fix piece by piece.

There is more than one cause; read the symptoms, then the code.

Write ``train_step`` so that training on N ranks equals training the same
model on the whole batch in one process (the shards are equal in size), and
it returns the global batch's mean loss as a Python float, the same on every
rank. ``inspect_train_step(train_step)`` then finds nothing. If your step
hangs, ``lecture_lib.run(..., timeout=...)`` and ``debugging.hang_report``
say where each rank waits: every rank must enter the same collectives in the
same order.

Hint: for each number the step produces (every parameter's gradient, the
update, the returned loss), ask what one process on the whole batch would
have produced, and which ranks hold the pieces of it.
"""
import torch.distributed as dist


def buggy_train_step(model, optimizer, x, y) -> float:
    """The step to fix (do not change it: notebook 09 runs the tools on it)."""
    optimizer.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    for name, p in model.named_parameters():
        if p.grad is not None and not name.endswith("bias"):
            dist.all_reduce(p.grad)
    optimizer.step()
    return loss.item()


def train_step(model, optimizer, x, y) -> float:
    raise NotImplementedError("ex11: your code here")
