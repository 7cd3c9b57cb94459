# Generated from solutions/ex14_ddp_step_time.py by `python -m lecture_lib.exercises`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grade exercises/ex14_ddp_step_time.py
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

The closed form of notebook 02b, and when it holds. Write ``F``, ``B`` (the
sum of ``backward_per_bucket``), ``c_i`` the all-reduce of bucket ``i``,
``C = sum c_i``, ``c_last`` the last one, ``O`` the optimizer, ``r_i`` the
ready time of bucket ``i`` (``r_last = F + B``). The communication stream is
a queue, so the last all-reduce ends at ``max_i (r_i + c_i + ... + c_last)``
(some bucket ``i`` starts a busy stretch that lasts to the end), and

    T_step = max_i (r_i + c_i + ... + c_last) + O.

The ``i = last`` term is ``F + B + c_last``; the ``i = 0`` term is
``r_0 + C >= F + C``. Keeping only these two gives

    T_step >= F + max(B, C - c_last) + c_last + O      (Li et al.'s model)

which is therefore a lower bound, and T_step <= F + B + C + O (no overlap).
It is exact when the ``i = last`` term is the largest, i.e. backward-bound:
the all-reduces of buckets ``i..last-1`` fit in the backward of buckets
``i+1..last`` for every ``i``; then only the last bucket is exposed,
T_step = F + B + c_last + O. When the stream never idles from the first bucket
on (communication-bound), T_step = F + b_0 + C + O: the model misses the
first bucket's backward ``b_0``. In between, a backward-heavy start followed by
communication-heavy buckets can put it below T_step by up to
``min(B, C - c_last)``.
"""


def ring_all_reduce_seconds(nbytes, world_size, alpha, beta):
    raise NotImplementedError("ex14: your code here")


def bucketed_step_seconds(forward, backward_per_bucket, bucket_bytes, optimizer, world_size,
                          alpha, beta):
    raise NotImplementedError("ex14: your code here")
