# Generated from solutions/ex06_one_f_one_b.py by `python -m lecture_lib.exercises`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grade exercises/ex06_one_f_one_b.py
"""Exercise 06: the 1F1B pipeline schedule, as data.

A pipeline schedule says, for every rank (stage), the ordered list of its
actions: ``Action("F", i)`` runs micro-batch ``i`` forward through the stage,
``Action("B", i)`` runs it backward. Write 1F1B ("one forward, one backward",
PipeDream-Flush; Narayanan et al. 2021, section 2.2.1) for ``num_stages`` ranks
and ``num_microbatches`` micro-batches, in three phases per rank ``r``:

1. warm-up: ``min(p - r - 1, m)`` forwards (micro-batches 0, 1, ...);
2. steady state: alternate one forward (the next micro-batch) and one
   backward (the oldest micro-batch whose backward is still to do), until
   every forward is done;
3. cool-down: the remaining backwards, oldest first.

So the last rank alternates F0 B0 F1 B1 ..., and rank r never holds more
than ``p - r`` micro-batches' activations (GPipe holds all ``m``). Your lists
are checked by :func:`lecture_lib.pipeline.validate` (complete, and no rank
waits on a message that is sent after it) and by the simulator
(:func:`lecture_lib.pipeline.simulate`: bubble (p-1)/(m+p-1), peak memory
min(m, p - r)). Try ``print(make_schedule("1f1b", 3, 4))`` for the answer's
shape once yours works.
"""
from lecture_lib.pipeline import Action


def one_f_one_b(num_stages: int, num_microbatches: int) -> list[list[Action]]:
    """``actions[r]``: rank r's ordered list of Action("F", i) and Action("B", i)."""
    raise NotImplementedError("ex06: your code here")
