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
    # BEGIN SOLUTION
    p, m = num_stages, num_microbatches
    actions = []
    for rank in range(p):
        todo_f, todo_b, acts = 0, 0, []
        for _ in range(min(p - rank - 1, m)):          # warm-up
            acts.append(Action("F", todo_f))
            todo_f += 1
        while todo_f < m:                              # steady state
            acts.append(Action("F", todo_f))
            acts.append(Action("B", todo_b))
            todo_f, todo_b = todo_f + 1, todo_b + 1
        while todo_b < m:                              # cool-down
            acts.append(Action("B", todo_b))
            todo_b += 1
        actions.append(acts)
    return actions
    # END SOLUTION
