# Generated from solutions/ex03_zero1_optimizer.py by `python -m lecture_lib.grading stubs`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grading grade exercises/ex03_zero1_optimizer.py
"""Exercise 03: ZeRO-1, a sharded optimizer (the interface of Stanford CS336 assignment 2).

Write ``ShardedOptimizer(params, optimizer_cls, **kwargs)``, a
``torch.optim.Optimizer`` that keeps optimizer state only for this rank's
share of the parameters:

* ``param_groups`` hold *every* parameter (so ``zero_grad`` reaches them all);
* parameters are owned one by one, round-robin in the order they are added
  (parameter i belongs to rank ``i % world_size``); the wrapped optimizer,
  made by ``optimizer_cls`` with ``**kwargs``, sees only this rank's
  parameters, so only they get optimizer state (Adam's moments, SGD's
  momentum). ``optimizer_cls`` is any ``torch.optim`` optimizer class: the
  tests pass AdamW, and SGD with momentum through a class of their own that
  notes every parameter it is given and the state it keeps;
* a rank may own no parameter of a group (a group smaller than the world, or
  a model with fewer parameters than ranks). Either choice is right: give the
  wrapped optimizer the group with an empty parameter list (the list-of-groups
  form accepts it: ``optimizer_cls([{"params": [], ...}], **kwargs)``, while
  ``optimizer_cls([], ...)`` raises "empty parameter list"), or leave the
  group out of the wrapped optimizer (and make the wrapped optimizer only once
  the rank owns a parameter; ``step()`` then only broadcasts);
* ``step()`` steps the owned parameters, then every parameter is broadcast
  from its owner (``dist.broadcast(p.data, src=owner)``), so each rank ends with
  all updated parameters. The tests count the bytes each rank broadcasts in
  ``step()`` (those of the parameters it owns) and look at every optimizer made
  during training: none may keep state for a parameter its rank does not own
  (a rank that updates every parameter itself is plain data parallelism);
* ``add_param_group`` works during training too (new parameters continue the
  round-robin; give the wrapped optimizer the owned ones, with the group's
  hyper-parameters).

Gradients arrive already averaged over the ranks (DDP's job), so ``step``
does no gradient communication.

Two traps, both about how ``torch.optim.Optimizer`` works inside:

* ``torch.optim.Optimizer.__init__`` calls ``self.add_param_group`` for every
  group you pass it, and that is *your* override. Whatever your
  ``add_param_group`` uses (rank, world size, the wrapped optimizer's class and
  keyword arguments, the table of owners) must exist before ``super().__init__``
  runs.
* The tests read ``opt.state`` to see which parameters have optimizer state on
  which rank. ``Optimizer.__init__`` gives ``self`` an empty ``state`` of its
  own, while the moments are created inside the wrapped optimizer: ``opt.state``
  must be the wrapped optimizer's ``state`` itself (the same dict, not a copy),
  or every rank appears to keep state for nothing.

Hints (the idea, not the code): the base class already does the checking and
default-filling of a group, so let it, then split the group it stored into the
parameters this rank owns; the wrapped optimizer gets a group with the same
hyper-parameters and only those. After the wrapped step, each parameter's
owner is the one rank whose copy is up to date: it is the source every other
rank copies from, in the same order on every rank. This is a simpler cut than
``lecture_lib.zero.ShardedOptimizer``, which slices every parameter into N
equal pieces: here a rank's share depends on how the sizes fall.
"""
import torch
import torch.distributed as dist


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        raise NotImplementedError("ex03: your code here")

    def add_param_group(self, param_group):
        raise NotImplementedError("ex03: your code here")

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        raise NotImplementedError("ex03: your code here")
