# shortcut: the queue right, the ring charged for its reduce-scatter only: (p-1) steps, not 2(p-1)
# graded as: ex14_ddp_step_time.py
# scores: at most 3
# message: with your ring_all_reduce_seconds
def ring_all_reduce_seconds(nbytes, world_size, alpha, beta):
    if nbytes < 0 or world_size < 1 or alpha < 0 or not beta > 0:
        raise ValueError("bad input")
    p = world_size
    return (p - 1) * alpha + (p - 1) / p * nbytes / beta


def bucketed_step_seconds(forward, backward_per_bucket, bucket_bytes, optimizer, world_size,
                          alpha, beta):
    backward, sizes = list(backward_per_bucket), list(bucket_bytes)
    if not backward or len(backward) != len(sizes) or min([forward, optimizer, *backward]) < 0:
        raise ValueError("bad input")
    ready = free = forward
    for b, n in zip(backward, sizes):
        ready += b
        free = max(ready, free) + ring_all_reduce_seconds(n, world_size, alpha, beta)
    return max(ready, free) + optimizer
