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
    # BEGIN SOLUTION
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, not {nbytes}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, not {world_size}")
    if alpha < 0:
        raise ValueError(f"alpha (latency, s) must be >= 0, not {alpha}")
    if not beta > 0:
        raise ValueError(f"beta (bandwidth, bytes/s) must be > 0, not {beta}")
    p = world_size
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta
    # END SOLUTION


def bucketed_step_seconds(forward, backward_per_bucket, bucket_bytes, optimizer, world_size,
                          alpha, beta):
    # BEGIN SOLUTION
    """The closed form of notebook 02, and when it holds. Write ``F``, ``B`` (the
    sum of ``backward_per_bucket``), ``c_i`` the all-reduce of bucket ``i``,
    ``C = sum c_i``, ``c_last`` the last one, ``O`` the optimizer, ``r_i`` the
    ready time of bucket ``i`` (``r_last = F + B``). The communication stream is
    a queue, so the last all-reduce ends at ``max_i (r_i + c_i + ... + c_last)``
    (some bucket ``i`` starts a busy stretch that lasts to the end), and

        t_step = max_i (r_i + c_i + ... + c_last) + O.

    The ``i = last`` term is ``F + B + c_last``; the ``i = 0`` term is
    ``r_0 + C >= F + C``. Keeping only these two gives

        t_step >= F + max(B, C - c_last) + c_last + O      (Li et al.'s model)

    which is therefore a lower bound, and t_step <= F + B + C + O (no overlap) =
    the bound plus ``min(B, C - c_last)``. It is exact exactly when one of the two
    kept terms is the largest:

    * the ``i = last`` term (backward-bound): for every ``i`` the all-reduces of
      buckets ``i..last-1`` fit in the backward of buckets ``i+1..last``, so the
      communication stream has caught up when backward ends and only the last
      bucket is exposed: t_step = F + B + c_last + O;
    * the ``i = 0`` term with ``b_0 = 0`` (the first bucket ready as backward
      starts). When the stream never idles from the first bucket on
      (communication-bound) t_step = F + b_0 + C + O: the model misses ``b_0``.

    In between, a backward-heavy start followed by communication-heavy buckets
    puts the model below t_step by up to ``min(B, C - c_last)``; one bucket
    (``c_last = C``) overlaps nothing and the model is exact: F + B + C + O.
    """
    backward_per_bucket, bucket_bytes = list(backward_per_bucket), list(bucket_bytes)
    if not backward_per_bucket or len(backward_per_bucket) != len(bucket_bytes):
        raise ValueError(f"one backward time per bucket: {len(backward_per_bucket)} times "
                         f"for {len(bucket_bytes)} buckets")
    if min([forward, optimizer, *backward_per_bucket]) < 0:
        raise ValueError("times must be >= 0")
    ready = comm_free = forward           # the compute stream's and the comm stream's times
    for backward, nbytes in zip(backward_per_bucket, bucket_bytes):
        ready += backward                                       # this bucket's gradients
        start = max(ready, comm_free)                           # ... and a free stream
        comm_free = start + ring_all_reduce_seconds(nbytes, world_size, alpha, beta)
    return max(ready, comm_free) + optimizer
    # END SOLUTION
