# Generated from solutions/ex14_ddp_step_time.py by `python -m lecture_lib.grading stubs`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grading grade exercises/ex14_ddp_step_time.py
"""Exercise 14: the step time of bucketed DDP, from two streams.

Bucketed DDP (Li et al. 2020, "PyTorch Distributed", section 3.2.3) all-reduces
each bucket of gradients asynchronously as soon as backward has produced it,
so communication overlaps the rest of backward. On a GPU the all-reduces run
on a stream of their own. Predict how long one step takes.

1. ``ring_all_reduce_seconds(nbytes, world_size, alpha, beta)``: the alpha-beta
   cost of a ring all-reduce of an ``nbytes`` buffer over ``world_size`` ranks
   on a link of latency ``alpha`` (s) and bandwidth ``beta`` (bytes/s): a
   reduce-scatter then an all-gather, ``2 (p-1)`` steps each moving ``n/p``
   bytes (Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp 2005). One rank
   costs nothing. ``ValueError`` for ``nbytes < 0``, ``world_size < 1``,
   ``alpha < 0`` or ``beta <= 0``.

2. ``bucketed_step_seconds(forward, backward_per_bucket, bucket_bytes, optimizer,
   world_size, alpha, beta)``: the step on two streams. Buckets become ready in
   order: bucket ``i`` is ready once the forward and the backward time of
   buckets ``0..i`` are done (``backward_per_bucket[i]`` is the backward time
   between bucket ``i-1`` and bucket ``i`` being ready). Bucket ``i``'s
   all-reduce (of ``bucket_bytes[i]`` bytes, cost as in 1.) starts when it is
   ready *and* the communication stream is free (all-reduces run in bucket
   order). The optimizer starts when backward and the last all-reduce are
   done. Return the step's seconds. ``ValueError`` when the two lists differ
   in length or are empty, or any time or size is negative.

3. On paper: notebook 02 reads the emulated step against Li et al.'s closed form
   ``t_step ~= t_fwd + max(t_bwd, t_comm - t_last) + t_last + t_opt`` (times ``t``
   in seconds; ``t_comm`` all the all-reduces, ``t_last`` the last bucket's).
   Write the end of the last all-reduce in closed form (the communication stream
   is a queue), then say: can the step be shorter than this formula? When is the
   formula exact, and by how much can it be off? (The tests check your step on bucket layouts
   this statement does not show, against the queue's closed form and the emulation's two
   streams; on the emulated DDP step within 5%; and on a few cases by hand.)
"""


def ring_all_reduce_seconds(nbytes, world_size, alpha, beta):
    raise NotImplementedError("ex14: your code here")


def bucketed_step_seconds(forward, backward_per_bucket, bucket_bytes, optimizer, world_size,
                          alpha, beta):
    raise NotImplementedError("ex14: your code here")
