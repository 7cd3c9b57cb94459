# shortcut: each all-reduce starts when its bucket is ready, not waiting for the one before it
# graded as: ex14_ddp_step_time.py
# scores: at most 4.5
# message: all-reduces that overlap each other
def ring_all_reduce_seconds(nbytes, world_size, alpha, beta):
    if nbytes < 0 or world_size < 1 or alpha < 0 or not beta > 0:
        raise ValueError("bad input")
    p = world_size
    return 0.0 if p == 1 else 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta


def bucketed_step_seconds(forward, backward_per_bucket, bucket_bytes, optimizer, world_size,
                          alpha, beta):
    backward, sizes = list(backward_per_bucket), list(bucket_bytes)
    if not backward or len(backward) != len(sizes) or min([forward, optimizer, *backward]) < 0:
        raise ValueError("bad input")
    ready, end = forward, 0.0
    for b, n in zip(backward, sizes):
        ready += b
        end = max(end, ready + ring_all_reduce_seconds(n, world_size, alpha, beta))
    return max(ready, end) + optimizer
