"""lecture_lib.data_parallel.emulated: the course's DDP on an emulated cluster (virtual time).

What is checked here is the experiment's accounting: its communication time is
the sum of what the cluster charges for each bucket's all-reduce
(``Cluster.collective_seconds``, whose formulas ``tests/test_emulate.py`` checks
against the textbook), and a world of ``p`` ranks inside a bigger one times as
a world of ``p``.
"""
import pytest

import lecture_lib
from lecture_lib import emulate
from lecture_lib.data_parallel import emulated as dp_emulated
from lecture_lib.models import GPTConfig

H100 = emulate.preset("h100-node")
TINY = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=2, n_layers=2)


def test_weak_scaling_charges_each_bucket_and_equals_a_world_of_p():
    one, two = dp_emulated.measure_weak_scaling([1, 2], TINY, 2, 0.01)
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["collectives"] == 0 and one["comm"] == 0.0
    assert sum(two["bucket_bytes"]) == two["grad_bytes"]
    assert two["collectives"] == len(two["bucket_bytes"])
    charged = sum(H100.collective_seconds("all_reduce", n, [0, 1]) for n in two["bucket_bytes"])
    assert two["comm"] == pytest.approx(charged, rel=1e-9, abs=0)
    for r in (one, two):
        assert r["tokens_per_s"] == r["world_size"] * r["tokens_per_rank"] / r["step"]
    # the first p ranks of a bigger world time exactly as a world of p ranks
    world = dp_emulated.measure_ddp([{"variant": "bucketed", "bucket_size_mb": 0.01}], 2, TINY,
                                    2, steps=1)[0]
    assert world["step"] == two["step"] and world["spans"] == two["spans"]


@pytest.mark.parametrize("sizes", [[], [0], [1, 2.5], "4", [True]])
def test_weak_scaling_refuses_bad_world_sizes_before_any_process(monkeypatch, sizes):
    monkeypatch.setattr(dp_emulated.launch, "run", lambda *a, **k: pytest.fail("ranks started"))
    with pytest.raises(ValueError, match="world_sizes"):
        dp_emulated.measure_weak_scaling(sizes, TINY, 2, 0.01)
    with pytest.raises(ValueError, match="bucket_size_mb"):
        dp_emulated.measure_weak_scaling([1, 2], TINY, 2, -1.0)


def test_bad_variants_and_sizes_are_refused_before_any_process(monkeypatch):
    monkeypatch.setattr(dp_emulated.launch, "run", lambda *a, **k: pytest.fail("ranks started"))
    with pytest.raises(ValueError, match="variant"):
        dp_emulated.measure_ddp([{"variant": "torch"}], 2, TINY, 2)
    with pytest.raises(ValueError, match="batch_per_rank"):
        dp_emulated.emulation_overhead("flat", 2, TINY, 0)
    with pytest.raises(TypeError, match="GPTConfig"):
        dp_emulated.measure_ddp([{"variant": "flat"}], 2, "gpt", 2)


# ----------------------------------------------------------------------------
# The dry run: the same rank function on fake tensors reads the real run's clock
# ----------------------------------------------------------------------------

SMALL = GPTConfig(vocab_size=64, seq_len=32, d_model=64, n_heads=4, n_layers=2)


def _real_and_dry(variant, bucket_size_mb, accumulation):
    return {dry: dp_emulated.ddp_step(variant, SMALL, 4, 1, bucket_size_mb, "h100-node",
                                      accumulation=accumulation, optimizer="adamw",
                                      dry_run=dry)
            for dry in (False, True)}


@pytest.mark.parametrize("variant,bucket_size_mb,accumulation", [
    ("flat", None, 1), ("individual", None, 1), ("bucketed", 0.05, 1),
    ("bucketed", 0.05, 2)], ids=["flat", "per-parameter", "bucketed", "bucketed, no_sync"])
def test_each_variants_dry_clock_equals_the_real_ones(variant, bucket_size_mb, accumulation):
    for rank in lecture_lib.run(_real_and_dry, 2, variant, bucket_size_mb, accumulation,
                                timeout=120):
        real, dry = rank[False], rank[True]
        assert real["clock"]["now"] > 0 and real["clock"]["comm_bytes"] > 0
        assert dry["clock"] == real["clock"]          # now, totals, bytes, spans, issue times
        assert dry == real                            # and the split read from it


def test_time_at_scale_splits_the_step_and_accumulation_divides_comm_per_sample():
    rows = dp_emulated.time_at_scale(SMALL, [{"variant": "flat"},
                                             {"variant": "bucketed", "bucket_size_mb": 0.05},
                                             {"variant": "bucketed", "bucket_size_mb": 0.05,
                                              "accumulation": 2}],
                                     world_size=2, micro_batch=2, timeout=120)
    flat, bucketed, accumulated = rows
    for r in rows:
        parts = r["forward"] + r["backward"] + r["optimizer"] + r["exposed"]
        assert parts == pytest.approx(r["step"], rel=1e-9) and r["exposed"] >= -1e-12
        assert r["world_size"] == 2 and r["wall_s"] > 0 and "clock" not in r
        assert sum(r["bucket_bytes"]) == r["grad_bytes"]   # every gradient once per step
        # the compute phases include the stream's waits for launches (a small model's many)
        assert 0 < r["launch_waits"] < r["forward"] + r["backward"] + r["optimizer"]
    assert flat["collectives"] == 1 < bucketed["collectives"] == accumulated["collectives"]
    assert accumulated["samples_per_rank"] == 2 * bucketed["samples_per_rank"] == 4
    assert accumulated["comm_per_sample"] == pytest.approx(bucketed["comm_per_sample"] / 2)


def test_time_at_scale_times_the_second_step_after_adamw_made_its_state():
    """The first AdamW step also creates the two moments (memory writes the dry run charges);
    time_at_scale times the steady step, the second, unless told otherwise."""
    first, = dp_emulated.time_at_scale(SMALL, [{"variant": "flat"}], world_size=2,
                                       micro_batch=2, steps=1, timeout=120)
    second, = dp_emulated.time_at_scale(SMALL, [{"variant": "flat"}], world_size=2,
                                        micro_batch=2, timeout=120)
    assert second["optimizer"] < first["optimizer"]
    assert second["forward"] == pytest.approx(first["forward"], rel=1e-9)
    assert second["comm"] == pytest.approx(first["comm"], rel=1e-9)
    with pytest.raises(ValueError, match="steps"):
        dp_emulated.time_at_scale(SMALL, [{"variant": "flat"}], world_size=2, steps=0)


@pytest.mark.parametrize("config,message", [
    ({"variant": "torch"}, "variant"), ({"variant": "flat", "bucket": 1}, "unknown keys"),
    ({"variant": "bucketed", "bucket_size_mb": 0}, "bucket_size_mb"),
    ({"variant": "flat", "accumulation": 0}, "accumulation")])
def test_time_at_scale_refuses_bad_configurations_before_any_process(monkeypatch, config,
                                                                     message):
    monkeypatch.setattr(dp_emulated.launch, "run", lambda *a, **k: pytest.fail("ranks started"))
    with pytest.raises(ValueError, match=message):
        dp_emulated.time_at_scale(SMALL, [config], world_size=2)
