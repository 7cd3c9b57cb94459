"""lecture_lib.data_parallel.emulated: the course's DDP on an emulated cluster (virtual time).

What is checked here is the experiment's accounting: its communication time is
the sum of what the cluster charges for each bucket's all-reduce
(``Cluster.collective_seconds``, whose formulas ``tests/test_emulate.py`` checks
against the textbook), and a world of ``p`` ranks inside a bigger one times as
a world of ``p``.
"""
import pytest

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
