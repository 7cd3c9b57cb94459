"""Data-parallel overhead: what bucketing the gradient all-reduce costs and saves.

Stanford CS336 assignment 2 (section on bucketed DDP) models the time a
bucketed DDP step spends *after* backward (the exposed communication) with the
gradients' size ``n`` (bytes; CS336 writes it ``s``, which in this course is the
sequence length), the all-reduce bandwidth ``w`` (bytes/s), a fixed overhead ``o``
per all-reduce call (seconds) and ``n_b`` buckets, assuming every bucket but the
last overlaps the backward computation:

    overhead(n_b) = o * n_b + n / (w * n_b)

Few buckets leave a large last bucket exposed; many buckets pay the per-call
overhead often. The best number is ``n_b* = sqrt(n / (w o))``, i.e. a bucket
size of ``n / n_b* = sqrt(n w o)``. For a ring all-reduce over ``p`` ranks with
latency ``alpha`` and bandwidth ``beta`` (notebook 01), ``o = 2 (p-1) alpha`` and
``w = beta p / (2 (p-1))``. :func:`fit_ddp_overhead` recovers ``w`` and
``o`` from measured overheads by least squares (linear in ``n_b`` and ``1 / n_b``).

:func:`two_stream_step` is the step of bucketed DDP on a compute stream and a
communication stream (Li et al. 2020, "PyTorch Distributed", section 3.2.3):
bucket ``i`` is all-reduced once backward has produced it *and* the previous
all-reduce is done. Unlike ``t_fwd + max(t_bwd, t_comm - t_last) + t_last +
t_opt`` (times ``t`` in seconds), which assumes the all-reduces may start with
backward, it stays exact when communication outgrows backward (exercise 14
derives both).
"""
from __future__ import annotations

import math

import numpy as np


def ddp_overhead(model_bytes: float, bandwidth: float, per_call: float, n_buckets) -> float:
    """Seconds of exposed communication per step: ``o * n_b + n / (w * n_b)``, ``n`` =
    ``model_bytes``, ``w`` = ``bandwidth``, ``o`` = ``per_call``."""
    if model_bytes < 0 or bandwidth <= 0 or per_call < 0:
        raise ValueError("need model_bytes >= 0, bandwidth > 0 and per_call >= 0")
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be >= 1, not {n_buckets}")
    return per_call * n_buckets + model_bytes / (bandwidth * n_buckets)


def best_bucket_bytes(model_bytes: float, bandwidth: float, per_call: float) -> float:
    """The bucket size that minimises :func:`ddp_overhead`: ``sqrt(n w o)`` (at most ``n``)."""
    if model_bytes <= 0 or bandwidth <= 0 or per_call < 0:
        raise ValueError("need model_bytes > 0, bandwidth > 0 and per_call >= 0")
    return min(model_bytes, math.sqrt(model_bytes * bandwidth * per_call))


def two_stream_step(ready, comm, backward_end: float, optimizer: float = 0.0) -> float:
    """Seconds of a bucketed DDP step: the all-reduces queue on one stream.

    ``ready[i]``: when bucket ``i``'s gradients exist (seconds from the step's
    start, in launch order); ``comm[i]``: its all-reduce's seconds;
    ``backward_end``: when forward and backward are done; ``optimizer`` follows
    the later of the two streams.
    """
    if len(ready) != len(comm):
        raise ValueError(f"one ready time per all-reduce: {len(ready)} against {len(comm)}")
    if min([backward_end, optimizer, *ready, *comm]) < 0:
        raise ValueError("times must be >= 0")
    stream = 0.0
    for r, c in zip(ready, comm):
        stream = max(stream, r) + c
    return max(stream, backward_end) + optimizer


def fit_ddp_overhead(model_bytes: float, n_buckets, overheads) -> tuple[float, float]:
    """Least-squares ``(bandwidth, per_call)`` from overheads measured at several ``n_b``.

    Points are weighted by 1/overhead (relative error), as
    :func:`lecture_lib.costmodel.fit_alpha_beta` does. A coefficient that comes out
    negative is set to zero and the other refitted alone (``per_call = 0`` or an
    infinite bandwidth, meaning the data show no such cost).
    """
    n, y = np.asarray(n_buckets, float), np.asarray(overheads, float)
    if len(n) < 2 or len(n) != len(y):
        raise ValueError("need at least two (n_buckets, overhead) points of equal length")
    if model_bytes <= 0 or (n < 1).any() or (y <= 0).any():
        raise ValueError("need model_bytes > 0, n_buckets >= 1 and positive overheads")
    w = 1.0 / y
    a = np.stack([n, 1.0 / n], 1) * w[:, None]
    (per_call, inv), *_ = np.linalg.lstsq(a, y * w, rcond=None)   # inv = n / bandwidth
    if per_call < 0:
        per_call, inv = 0.0, float(np.sum(w * w * y / n) / np.sum((w / n) ** 2))
    if inv <= 0:
        inv, per_call = 0.0, float(np.sum(w * w * y * n) / np.sum((w * n) ** 2))
    bandwidth = model_bytes / inv if inv > 0 else math.inf
    return float(bandwidth), float(per_call)
