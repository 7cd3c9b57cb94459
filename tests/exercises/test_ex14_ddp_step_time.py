"""ex14: the step time of bucketed DDP, by hand, against the queue's closed form, and against
the emulation itself (lecture_lib.emulate: the course's bucketed DDP on 2 emulated H100s, with
the roofline charges whose all-reduce is the ideal ring the exercise models).

The emulated step runs here, in the test's own process (library code only, no submission):
the student's function only gets its numbers, in the sandbox."""
import random

import pytest

import lecture_lib
from lecture_lib import costmodel, emulate
from lecture_lib.data_parallel.emulated import ddp_step
from lecture_lib.grading import load_exercise
from lecture_lib.models import GPTConfig

ex = load_exercise("ex14")
POINTS = 10
# The lesson's model is the ideal ring: the emulation's roofline charges (alpha-beta rings)
ROOFLINE = emulate.preset("h100-node", charges="roofline")
NVLINK = ROOFLINE.link([0, 1])
A, BETA = 3e-6, 300e9
# a regime where neither "no overlap" nor Li et al.'s closed form is within 5% (checked below)
CFG = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=2, n_layers=2)
BATCH, BUCKET_MB = 128, 0.05


def _ring(n, p, alpha=A, beta=BETA):
    return emulate.collective_seconds("all_reduce", n, p, costmodel.Link("l", alpha, beta))


@pytest.mark.parametrize("n,p", [(0, 2), (1e6, 1), (1e6, 2), (2**20, 4), (3e8, 8), (12345, 3)])
def test_ring_all_reduce_is_what_the_emulation_charges(n, p):
    assert ex.ring_all_reduce_seconds(n, p, A, BETA) == pytest.approx(_ring(n, p), rel=1e-12)


def test_ring_all_reduce_by_hand():
    assert ex.ring_all_reduce_seconds(1e9, 1, A, BETA) == 0
    # 4 ranks: 6 latencies and 2 * 3/4 of the buffer over the link
    assert ex.ring_all_reduce_seconds(4e9, 4, 1e-5, 1e9) == pytest.approx(6e-5 + 6.0)


@pytest.mark.parametrize("bad", [(-1, 2, A, BETA), (10, 0, A, BETA), (10, 2, -1e-6, BETA),
                                 (10, 2, A, 0), (10, 2, A, -5.0)])
def test_ring_all_reduce_bad_input(bad):
    with pytest.raises(ValueError):
        ex.ring_all_reduce_seconds(*bad)


def _step(forward, backward, nbytes, optimizer, p=2, alpha=A, beta=BETA):
    return ex.bucketed_step_seconds(forward, backward, nbytes, optimizer, p, alpha, beta)


def test_one_bucket_overlaps_nothing():
    comm = _ring(8e6, 2)
    assert _step(1e-3, [2e-3], [8e6], 5e-4) == pytest.approx(1e-3 + 2e-3 + comm + 5e-4)


def test_fast_comm_exposes_only_the_last_bucket():
    # every all-reduce (~3 us) is far shorter than a bucket's backward (1 ms)
    sizes = [1e5, 2e5, 3e5, 4e5]
    got = _step(1e-3, [1e-3] * 4, sizes, 2e-4)
    assert got == pytest.approx(1e-3 + 4e-3 + _ring(4e5, 2) + 2e-4)


def test_slow_comm_hides_backward_but_the_first_bucket():
    # each all-reduce (~0.1 s) is far longer than a bucket's backward (1 ms): the comm stream
    # never idles after the first bucket is ready
    sizes = [3e10, 3e10, 3e10]
    comm = sum(_ring(n, 4) for n in sizes)
    assert _step(2e-3, [1e-3, 1e-3, 1e-3], sizes, 1e-3, p=4) == pytest.approx(
        2e-3 + 1e-3 + comm + 1e-3)


def test_the_closed_form_is_only_a_lower_bound():
    # a long first bucket then a long all-reduce: Li et al.'s model says 10 + eps
    a, b = 0.0, 1e9
    got = _step(0.0, [10.0, 0.0, 0.0], [0.0, 10e9, 1.0], 0.0, p=2, alpha=a, beta=b)
    assert got == pytest.approx(20.0 + 1e-9)


def _queue(forward, backward, nbytes, optimizer, p, alpha, beta):
    """The library's two-stream step (costmodel.two_stream_step) for the exercise's inputs."""
    ready, t = [], forward
    for b in backward:
        t += b
        ready.append(t)
    costs = [_ring(n, p, alpha, beta) for n in nbytes]
    return costmodel.two_stream_step(ready, costs, ready[-1], optimizer)


def test_random_steps_match_the_queue_closed_form():
    rng = random.Random(14)
    for _ in range(20):
        k, p = rng.randint(1, 8), rng.choice([1, 2, 4, 8])
        case = (rng.uniform(0, 1e-3), [rng.uniform(0, 1e-3) for _ in range(k)],
                [rng.uniform(0, 5e8) for _ in range(k)], rng.uniform(0, 1e-4), p,
                rng.uniform(0, 1e-5), rng.uniform(1e10, 5e11))
        want = _queue(*case)
        assert ex.bucketed_step_seconds(*case) == pytest.approx(want, rel=1e-9), case


@pytest.mark.parametrize("bad", [
    dict(backward=[1.0, 1.0], nbytes=[1.0]), dict(backward=[], nbytes=[]),
    dict(backward=[-1.0], nbytes=[1.0]), dict(backward=[1.0], nbytes=[-1.0]),
    dict(forward=-1.0), dict(optimizer=-1.0), dict(p=0), dict(beta=0.0)])
def test_bucketed_step_bad_input(bad):
    kw = dict(forward=1.0, backward=[1.0], nbytes=[1.0], optimizer=1.0, p=2, alpha=A, beta=BETA)
    kw.update(bad)
    with pytest.raises(ValueError):
        _step(kw["forward"], kw["backward"], kw["nbytes"], kw["optimizer"], kw["p"], kw["alpha"],
              kw["beta"])


@pytest.fixture(scope="module")
def emulated():
    """Rank 0's split of one bucketed DDP step on 2 emulated H100s (one rank launch)."""
    return lecture_lib.run(ddp_step, 2, "bucketed", CFG, BATCH, 2, BUCKET_MB, ROOFLINE,
                           timeout=240)[0]


def test_predicts_the_emulated_step_within_5_percent(emulated):
    r = emulated
    ready, f = r["bucket_ready"], r["forward"]
    backward = [ready[0] - f] + [b - a for a, b in zip(ready, ready[1:])]
    got = _step(f, backward, r["bucket_bytes"], r["optimizer"], 2, NVLINK.alpha, NVLINK.beta)
    no_overlap = f + r["backward"] + r["comm"] + r["optimizer"]
    closed = f + max(r["backward"], r["comm"] - r["last_bucket"]) + r["last_bucket"] + \
        r["optimizer"]
    assert len(ready) >= 3
    for other in (no_overlap, closed):     # the case tells the two-stream model from these
        assert abs(other - r["step"]) > 0.05 * r["step"]
    assert got == pytest.approx(r["step"], rel=0.05)
