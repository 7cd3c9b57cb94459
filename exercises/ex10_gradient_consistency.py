# Generated from solutions/ex10_gradient_consistency.py by `python -m lecture_lib.grading stubs`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grading grade exercises/ex10_gradient_consistency.py
"""Exercise 10: check that data-parallel replicas agree, and name the first that does not.

After the gradient all-reduce, every data-parallel replica must hold the same
gradient for every parameter, and after the optimizer step the same values.
A sync bug (a parameter left out, a rank that used another batch size...)
breaks this silently: the loss still falls.

Write ``first_inconsistent(model, atol)``. Call it on every rank of the
default process group. Walk the parameters in ``model.named_parameters()``
order; for each, compare this rank's gradient, then its value, with rank 0's
copy. Return, on EVERY rank, the first ``(name, kind, max_abs_diff)`` where
``kind`` is ``"grad"`` or ``"value"`` and ``max_abs_diff`` is the largest
absolute difference from rank 0 over all ranks and elements, if it is above
``atol``; return None when all agree. A parameter without a gradient
(``p.grad is None``) counts as a zero gradient. Do not change the model.

Hint: a rank can only compare with what it has, so first give every rank rank 0's
copy. Then a difference may be visible on rank 1 alone, yet every rank must return the
same answer: the ranks have to agree on the largest difference before deciding. (The
library's ``lecture_lib.debugging.check_gradient_consistency`` does the same in two
collectives for the whole model, and says which rank differs.)
"""
import torch
import torch.distributed as dist


def first_inconsistent(model: torch.nn.Module, atol: float = 1e-6):
    raise NotImplementedError("ex10: your code here")
