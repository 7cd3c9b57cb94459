"""Exercise 06: the interleaved 1F1B pipeline schedule, as data.

Notebook 06 runs 1F1B: each of ``p`` ranks holds one contiguous stage of the
model, and a step's idle share (the bubble) is (p-1)/(m+p-1) for ``m``
micro-batches. Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters using Megatron-LM", section 2.2.2)
cuts the model into ``p * v`` smaller *virtual stages* instead; rank ``r``
holds ``v`` of them, its chunks ``c = 0 .. v-1``, where chunk ``c`` is virtual
stage ``c * p + r``. A micro-batch's forward therefore visits ranks 0, 1, ...,
p-1, then rank 0 again (with chunk 1), and so on ``v`` times round; its
backward walks the same path in reverse. Each piece of work is 1/v as long, so
the pipeline fills and drains ``v`` times faster and the bubble becomes

    (p - 1) / (v m + p - 1).

Write ``interleaved_1f1b(num_stages, microbatches, chunks)``: for every rank,
the ordered list of its actions, ``Action("F", i, c)`` (forward of micro-batch
``i`` through the rank's chunk ``c``) and ``Action("B", i, c)`` (its backward).
Raise ``ValueError`` unless ``chunks >= 2`` and ``microbatches`` is a
multiple of ``num_stages`` (the schedule works on micro-batches in groups of p).

Your lists are checked, rank by rank, by :func:`lecture_lib.pipeline.validate`
(every action exactly once, messages matched in order, no deadlock) and by
:func:`lecture_lib.pipeline.simulate` with equal stage costs: the bubble must be
the formula above, and no rank may hold more activations than 1F1B's rule
allows. That rule: after its warm-up of ``w_r`` forwards, a rank alternates one
forward, one backward, so it never holds more than ``w_r + 1`` chunks'
activations, and ``w_r = 2 (p - r - 1) + (v - 1) p`` is the fewest forwards that
keep rank ``r`` busy until its first backward can start (see the hint). In the
simulator's unit (``Simulation.peak_activations[r]``, micro-batches, a chunk
counting 1/v of one) rank ``r`` may hold at most ``min(m, (w_r + 1) / v)``. For
``m >= 2p`` that is fewer than ``m``: holding all ``m`` is GPipe, whose memory
1F1B exists to avoid. For ``m = p`` the first ranks' warm-up covers every
forward, so they do hold all ``m`` (what Megatron-LM's schedule does too), and
only the later ranks hold fewer. Build a schedule with
``lecture_lib.pipeline.Schedule("mine", p, m, v, tuple(map(tuple, actions)))``
to run these checks yourself, and draw it with
``lecture_lib.figures.plots.plot_timeline(ax, simulate(schedule, 1, 2).timeline,
labels=True)``.

Hint: start from 1F1B's three phases (warm-up forwards, one forward one
backward, cool-down backwards) and ask, for each, what changes when a
micro-batch passes every rank ``v`` times. Keep the ranks working on a group
of ``p`` micro-batches through one chunk before moving that group to the next
chunk (the next rank is working on the same group one step behind); the
backwards visit the chunks in the opposite order. The last rank can start its
first backward only once micro-batch 0 has passed all ``v`` of its chunks:
count how many forwards every rank must have done by then, and check that it
is the ``w_r`` above (a rank does two more for each stage after it: why?).
"""
from lecture_lib.pipeline import Action


def interleaved_1f1b(num_stages: int, microbatches: int,
                     chunks: int) -> list[list[Action]]:
    """``actions[r]``: rank r's ordered list of Action("F", i, c) and Action("B", i, c)."""
    # BEGIN SOLUTION
    p, m, v = num_stages, microbatches, chunks
    if v < 2:
        raise ValueError(f"interleaving needs chunks >= 2, not {v}")
    if m % p:
        raise ValueError(f"microbatches ({m}) must be a multiple of num_stages ({p})")
    total = m * v                    # F (and B) actions per rank

    def nth(k: int, backward: bool) -> Action:
        group, within = divmod(k, p * v)        # groups of p micro-batches ...
        chunk = within // p                     # ... through chunk 0, then 1, ...
        microbatch = group * p + within % p
        return Action("B" if backward else "F", microbatch,
                      v - 1 - chunk if backward else chunk)

    actions = []
    for rank in range(p):
        # the first backward (last rank, last chunk, micro-batch 0) needs micro-batch 0 through
        # every chunk: (v - 1) p forwards on each rank, plus 2 per stage still behind this one
        warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
        acts = [nth(k, False) for k in range(warmup)]
        for k in range(total - warmup):
            acts += [nth(warmup + k, False), nth(k, True)]
        acts += [nth(k, True) for k in range(total - warmup, total)]
        actions.append(acts)
    return actions
    # END SOLUTION
