"""The capstone's prediction: each strategy's dry run reads the clock of the emulated real run
exactly; the trainer predicts GPT-2 small on emulated GPUs from the command line, real runs
write the same record to --out, and ``python -m lecture_lib.capstone compare`` draws them.

Tiny model (4 layers, d 32, context 16) for the clock equality, 2 ranks (4 for 3d); the CLI
as users run it, in subprocesses.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lecture_lib
from lecture_lib.capstone import cli
from lecture_lib.capstone import compare as compare_mod
from lecture_lib.capstone.predict import (
    modelled_memory,
    predict,
    same_clock_real_and_dry,
    strategy_layout,
)
from lecture_lib.capstone.report import FIELDS
from lecture_lib.models import GPTConfig, real_size
from lecture_lib.runtime import launch

ROOT = Path(__file__).resolve().parents[1]
TINY = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=4, n_layers=4)
TRAINER = [sys.executable, str(ROOT / "examples" / "train_gpt2.py")]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def _same_clocks(strategies, model, batch):
    """Rank function: each strategy's step on real tensors and in the dry run."""
    out = {}
    for strategy in strategies:
        dims, recipe = strategy_layout(strategy, 2 if strategy != "3d" else 4, model)
        out[strategy] = same_clock_real_and_dry(strategy, model, dims, recipe, batch)
    return out


@pytest.mark.parametrize("strategies, world", [
    (("ddp", "zero1", "zero2", "fsdp"), 2), (("tp", "pp"), 2),
    (("cp",), 2), (("3d",), 4)],
    ids=["data-parallel", "tp-pp", "cp", "3d"])
def test_each_strategys_dry_run_reads_the_real_runs_clock_exactly(strategies, world):
    for rank in lecture_lib.run(_same_clocks, world, strategies, TINY, 8, timeout=180):
        for strategy in strategies:
            real, dry = rank[strategy][False], rank[strategy][True]
            assert real["now"] > 0 and real["comm_bytes"] > 0, strategy
            assert dry == real, strategy          # now, totals, bytes, spans, issue times


def test_a_prediction_says_how_much_of_its_step_computes():
    """``compute_seconds``: the compute stream's busy time in the timed step. ZeRO-1 sends
    DDP's bytes and computes less: its AdamW steps half the parameters on 2 GPUs."""
    model = real_size("GPT-2 small", n_layers=2)
    ddp, zero1 = (predict(s, 2, model=model, global_batch=4) for s in ("ddp", "zero1"))
    for r in (ddp, zero1):
        assert 0 < r["compute_seconds"] < r["step_time"]
    assert zero1["compute_seconds"] < ddp["compute_seconds"]


def test_a_prediction_gives_each_ranks_compute():
    """``rank_compute_seconds``: one entry per rank, in rank order; the rank that ends the step
    last gives ``compute_seconds``. A pp stage's compute: the last stage also runs the head."""
    model = real_size("GPT-2 small", n_layers=2)
    pp = predict("pp", 2, model=model, global_batch=4)
    ranks = pp["rank_compute_seconds"]
    assert len(ranks) == 2 and all(0 < c < pp["step_time"] for c in ranks)
    assert pp["compute_seconds"] in ranks
    assert ranks[-1] > ranks[0]                 # the last stage runs the output head


def test_a_predictions_memory_is_the_modelled_memory_at_its_layout():
    """``memory_per_gpu`` is :func:`modelled_memory`'s total at the strategy's layout and
    micro-batch; tp splits the weights but each GPU holds the whole batch's activations, so at
    the same global batch it holds more activations than ddp, whose GPUs each hold a slice."""
    model = real_size("GPT-2 small", n_layers=2)
    parts = {}
    for strategy in ("ddp", "tp"):
        row = predict(strategy, 2, model=model, global_batch=4)
        dims, _ = strategy_layout(strategy, 2, model)
        stage = 0
        parts[strategy] = modelled_memory(model, dims, stage, row["settings"]["micro-batch size"])
        assert parts[strategy]["total"] == row["memory_per_gpu"], strategy
    assert parts["tp"]["activations"] > parts["ddp"]["activations"]
    assert parts["tp"]["params"] < parts["ddp"]["params"]


def test_modelled_memory_counts_the_states_autocast_keeps():
    """The lab runs bf16 autocast: fp32 weights, gradients and AdamW state, so ZeRO-1 at
    dp 4 holds 4 + 4 + 8/4 = 10 bytes per parameter (not mixed precision's 2 + 2 + 12/4 = 7),
    and the states ``predict`` counts in the dry run are what the model says."""
    model = real_size("GPT-2 small")
    dims, _ = strategy_layout("zero1", 4, model)
    mem = modelled_memory(model, dims, 1, 16)
    states = sum(mem[k] for k in ("params", "grads", "optimizer"))
    assert states / model.num_params() == pytest.approx(10)
    small = real_size("GPT-2 small", n_layers=2)
    row = predict("zero1", 2, model=small, global_batch=4)
    dims, _ = strategy_layout("zero1", 2, small)
    counted = modelled_memory(small, dims, 1, row["settings"]["micro-batch size"])
    assert row["state_bytes_counted"] == pytest.approx(
        sum(counted[k] for k in ("params", "grads", "optimizer")), rel=0.01)


def test_modelled_memory_counts_no_attention_scores_as_the_fused_attention_keeps_none():
    """The course's GPT runs scaled_dot_product_attention, which keeps no attention scores:
    the activations are Korthikanti et al.'s 34 sbh per layer (no tp), not 34 + 5as/h."""
    model = real_size("GPT-2 small")
    dims, _ = strategy_layout("ddp", 4, model)
    mem = modelled_memory(model, dims, 0, 16)
    sbh = model.seq_len * 16 * model.d_model
    assert mem["activations"] == pytest.approx(model.n_layers * 34 * sbh)


def test_layouts_of_the_strategies_on_gpt2_small():
    for world in (4, 8):
        for strategy in ("ddp", "zero1", "zero2", "fsdp", "tp", "pp", "cp", "3d"):
            dims, _ = strategy_layout(strategy, world)
            assert dims.world_size == world
    assert strategy_layout("tp", 8)[0].tp == 4          # 12 heads: not 8
    assert strategy_layout("pp", 8)[0].pp == 4          # 12 layers: not 8
    assert strategy_layout("3d", 8)[0].sizes() == {"dp": 2, "pp": 2, "cp": 1, "tp": 2}


def test_gpt2_small_predicted_from_the_command_line(tmp_path):
    """As users run it: GPT-2 small (124M, 1024 tokens), DDP on 4 emulated H100s, dry."""
    out = tmp_path / "predicted.json"
    proc = subprocess.run([*TRAINER, "--emulate", "h100-node", "--dry-run", "--strategy", "ddp",
                           "--world-size", "4", "--out", str(out)], env=ENV, text=True,
                          capture_output=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record, = json.loads(out.read_text())
    assert set(FIELDS) <= set(record) and record["model"] == "GPT-2 small"
    assert record["time_kind"] == "emulated H100 + NVLink (dry run)"
    assert 5e-3 < record["step_time"] < 0.5 and 0.05 < record["mfu"] < 0.7
    assert record["peak_flops"] == 989e12 and "bf16 dense" in record["peak"]
    assert record["settings"]["precision"].startswith("bf16")
    assert 2e9 < record["memory_per_gpu"] < 80e9
    assert record["wall_seconds"] < 120           # 2-60 s measured here, by the load
    assert "ddp" in proc.stdout and "MFU against H100 SXM bf16 dense peak" in proc.stdout


@pytest.fixture(scope="module")
def out_files(tmp_path_factory):
    """Two small real CPU runs (ddp, fsdp on 2 ranks) and a dry-run prediction of ddp on 2
    emulated H100s, each written by the trainer's --out."""
    folder = tmp_path_factory.mktemp("runs")
    base = np.random.default_rng(0).integers(0, 30, 200)
    np.concatenate([np.roll(base, k) for k in range(40)]).astype(np.uint16).tofile(
        folder / "train.bin")
    model = ["--layers", "2", "--d-model", "32", "--heads", "4", "--context", "32"]
    files = {}
    for strategy in ("ddp", "fsdp"):
        files[strategy] = folder / f"{strategy}.json"
        proc = subprocess.run([*TRAINER, "--tokens", str(folder / "train.bin"), "--vocab-size",
                               "30", *model, "--steps", "4", "--world-size", "2", "--strategy",
                               strategy, "--peak-flops", "1e12", "--log-every", "2", "--out",
                               str(files[strategy])], env=ENV, text=True, capture_output=True,
                              timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
    files["predicted"] = folder / "predicted.json"
    proc = subprocess.run([*TRAINER, "--emulate", "h100-node", "--dry-run", "--strategy", "ddp",
                           "--world-size", "2", *model, "--batch", "8", "--out",
                           str(files["predicted"])], env=ENV, text=True, capture_output=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return files


def test_a_real_run_writes_the_same_record(out_files):
    real = json.loads(out_files["ddp"].read_text())
    predicted, = json.loads(out_files["predicted"].read_text())
    assert set(FIELDS) <= set(real) and set(FIELDS) <= set(predicted)
    assert real["time_kind"] == "real" and real["hardware"].startswith("CPU")
    assert real["timing"].startswith("median of 3 steps after 1 warm-up step")
    low, high = real["step_time_spread"]
    assert low <= real["step_time"] <= high
    assert real["tokens_per_s"] == pytest.approx(8 * 32 / real["step_time"])
    assert real["losses"] and real["first_step"] == 0                # the run's own result too


def test_compare_draws_measured_against_predicted(out_files, tmp_path):
    png = tmp_path / "compare.png"
    proc = subprocess.run([sys.executable, "-m", "lecture_lib.capstone", "compare",
                           *map(str, out_files.values()), "--png", str(png)], env=ENV,
                          text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert png.stat().st_size > 10_000
    assert "ddp.json (real): median of 3 steps after 1 warm-up step(s) dropped" in proc.stdout
    assert "predicted.json (emulated H100 + NVLink (dry run))" in proc.stdout
    assert "ddp on 2: measured / predicted step time = " in proc.stdout


def test_bad_input_before_any_process(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail("ranks started"))
    with pytest.raises(ValueError, match="--dry-run predicts an emulated run: give --emulate"):
        cli.main(["--dry-run"])
    with pytest.raises(ValueError, match="unknown emulation preset 'tpu'"):
        cli.main(["--dry-run", "--emulate", "tpu"])
    with pytest.raises(ValueError, match="unknown strategy 'zero4'"):
        cli.main(["--dry-run", "--emulate", "h100-node", "--strategy", "zero4"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"strategy": "ddp"}))
    proc = subprocess.run([sys.executable, "-m", "lecture_lib.capstone", "compare", str(bad)],
                          env=ENV, text=True, capture_output=True, timeout=60)
    assert proc.returncode != 0 and "a record without world_size" in proc.stderr


def test_compare_of_measured_runs_alone_has_no_ratio_and_short_labels(out_files, tmp_path):
    png = tmp_path / "measured.png"
    proc = subprocess.run([sys.executable, "-m", "lecture_lib.capstone", "compare",
                           str(out_files["ddp"]), "--png", str(png)], env=ENV,
                          text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert png.stat().st_size > 10_000 and "measured / predicted" not in proc.stdout
    real = json.loads(out_files["ddp"].read_text())
    assert compare_mod.short_label("measured", "real", real["hardware"]).endswith(", measured")
    assert compare_mod.short_label("predicted", "emulated H100 + NVLink (dry run)",
                                   "4 x H100 SXM, 8 per node") == "H100 SXM (emulated)"
    assert compare_mod.stamp_kind(real) == "measured (real time)"
    drawn = compare_mod.compare([out_files["ddp"]], tmp_path / "titled.png")
    assert drawn["title"].startswith("Measured step time, per strategy")
    assert compare_mod.compare([out_files["ddp"]], tmp_path / "t.png", title="the message")[
        "title"] == "the message"
