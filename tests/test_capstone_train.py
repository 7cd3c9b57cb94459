"""The capstone trainer: every strategy equals one process, resumes bit-exactly, reshards,
survives a killed rank (lecture_lib.run and torchrun), and refuses bad input early.

Tiny model (2 layers, d 32, context 32), 4 steps, 2 ranks (4 for the fsdp(4) save and the
3d = dp2 x tp2 run). Tolerances: a strategy's losses against one-process training within
rtol 1e-5 (float32 rounding of a different summation order); a resumed run of the same
strategy equals the uninterrupted run exactly; a resharded run within rtol 1e-5.
"""
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import lecture_lib
from lecture_lib import metrics
from lecture_lib.capstone import checkpoint, cli, elastic
from lecture_lib.capstone.cli import main as cli_main
from lecture_lib.capstone.experiments import resume_and_reshard
from lecture_lib.capstone.loader import TokenLoader
from lecture_lib.capstone.report import non_embedding_params
from lecture_lib.capstone.train import TrainConfig, check_config, train
from lecture_lib.dims import ParallelDims, Recipe
from lecture_lib.models import GPT, GPTConfig, train_reference
from lecture_lib.runtime import launch

ROOT = Path(__file__).resolve().parents[1]
# vocab 30: tok_emb's 30 rows do not split over 4 ranks, so fsdp(4) checkpoints it gathered
MODEL = GPTConfig(vocab_size=30, seq_len=32, d_model=32, n_heads=4, n_layers=2)
STEPS, K, LR, RTOL = 4, 2, 3e-3, 1e-5
DP2 = ParallelDims(dp=2)
RUNS = {                                             # name -> layout and options
    "ddp": dict(strategy="ddp", dims=DP2), "zero1": dict(strategy="zero1", dims=DP2),
    "zero2": dict(strategy="zero2", dims=DP2), "fsdp": dict(strategy="fsdp", dims=DP2),
    "tp": dict(strategy="tp", dims=ParallelDims(tp=2)),
    "pp": dict(strategy="pp", dims=ParallelDims(pp=2), recipe=Recipe(microbatches=2)),
    "cp": dict(strategy="cp", dims=ParallelDims(cp=2)),
    "3d": dict(strategy="3d", dims=ParallelDims(dp=2, tp=2)),
    "fsdp4": dict(strategy="fsdp", dims=ParallelDims(dp=4)),
}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """A learnable stream: one random sequence of 200 tokens, rotated 40 times."""
    base = np.random.default_rng(0).integers(0, MODEL.vocab_size, 200)
    path = tmp_path_factory.mktemp("tokens") / "train.bin"
    np.concatenate([np.roll(base, k) for k in range(40)]).astype(np.uint16).tofile(path)
    return str(path)


@pytest.fixture(scope="module")
def cfg(tokens):
    return TrainConfig(model=MODEL, tokens=tokens, steps=STEPS, lr=LR, global_batch=8,
                       log_every=STEPS, peak_flops=1e12)     # MFU's peak: not measured here


@pytest.fixture(scope="module")
def uninterrupted(cfg):
    """Each strategy's losses over STEPS, trained without a stop (cached for the module)."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = train(cfg, timeout=120, **RUNS[name])["losses"]
        return cache[name]
    return get


def _close(a, b, rtol=RTOL):
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=rtol) for x, y in zip(a, b))


def test_every_strategy_equals_one_process(cfg, uninterrupted):
    loader = TokenLoader(cfg.tokens, MODEL.seq_len, cfg.global_batch)
    ref = train_reference(GPT(MODEL, 0), loader.batch, STEPS, LR, "adamw").losses
    assert ref[-1] < ref[0] - 0.05                         # it learns
    for name in ("ddp", "zero1", "zero2", "fsdp", "tp", "pp", "cp"):
        got = uninterrupted(name)
        print(name, got)
        assert _close(got, ref), f"{name}: {got} vs one process {ref}"


@pytest.mark.parametrize("name", ["ddp", "fsdp", "3d"])
def test_resume_equals_uninterrupted(cfg, uninterrupted, tmp_path, name):
    first = train(cfg, timeout=120, steps=K, checkpoint_dir=str(tmp_path), checkpoint_every=K,
                  **RUNS[name])
    second = train(cfg, timeout=120, checkpoint_dir=str(tmp_path), **RUNS[name])
    assert second["first_step"] == K and second["resumed_from"].endswith(f"step_{K:06d}")
    assert first["losses"] + second["losses"] == uninterrupted(name)      # bit-exact


def test_reshard_fsdp4_to_tp2_and_ddp2(cfg, uninterrupted, tmp_path):
    """resume_and_reshard (the notebook's first picture): fsdp(4) stops at a checkpoint at
    step K; tp 2 and ddp 2 each continue from it, within RTOL of the uninterrupted fsdp(4)."""
    got = resume_and_reshard(cfg, tmp_path, K, RUNS["fsdp4"],
                             {"tp": RUNS["tp"], "ddp": RUNS["ddp"]}, timeout=120)
    ref = uninterrupted("fsdp4")
    assert got["uninterrupted"] == ref and got["before"] == ref[:K]
    for target, losses in got["resumed"].items():
        assert _close(losses, ref[K:]), f"fsdp(4) -> {target}: {losses}"
        assert got["gaps"][target] < RTOL
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        resume_and_reshard(cfg, tmp_path, K, RUNS["fsdp4"], {"ddp": RUNS["ddp"]})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_killed_rank_under_run_then_resume(cfg, uninterrupted, tmp_path):
    expected = uninterrupted("ddp")[-1]                 # also leaves a warm pool of 2 ranks
    before = launch.worker_pids(2)
    assert before
    kw = dict(RUNS["ddp"], checkpoint_dir=str(tmp_path), checkpoint_every=2, fail_at=3,
              fail_rank=1)
    with pytest.raises(lecture_lib.RankError, match="rank 1"):
        train(cfg, timeout=120, **kw)
    assert [p for p in before if _alive(p)] == []       # no process left behind
    resumed = train(cfg, timeout=120, **kw)             # the marker stops a second kill
    assert resumed["first_step"] == 2
    assert resumed["losses"][-1] == expected


def test_torchrun_restart_finishes_with_the_uninterrupted_loss(cfg, uninterrupted, tmp_path):
    """The README's failure demo as users run it: no TORCH_DISABLE_SHARE_RDZV_TCP_STORE.

    torchrun shares its rendezvous store with the workers, and a restarted gloo worker used
    to read the dead worker's address there (pytorch/pytorch#135712: Connection refused, or
    a wait without end). The trainer keys its group by restart generation; should anything
    still wait, its watchdog ends the rank after --timeout 60 s with a message, well within
    this test's 240 s (and pytest's 300 s)."""
    expected = uninterrupted("ddp")[-1]
    out, ck = tmp_path / "out.json", tmp_path / "ck"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=1", str(ROOT / "examples" / "train_gpt2.py"), "--tokens", cfg.tokens,
           "--vocab-size", "30", "--layers", "2", "--d-model", "32", "--heads", "4",
           "--context", "32", "--steps", str(STEPS), "--lr", str(LR), "--log-every", "1",
           "--checkpoint-dir", str(ck), "--checkpoint-every", "2", "--fail-at", "3",
           "--fail-rank", "1", "--peak-flops", "1e12", "--timeout", "60", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, log[-3000:]
    assert "SIGKILL at step 3" in log and "connectFullMesh" not in log
    result = json.loads(out.read_text())
    assert result["first_step"] == 2
    assert result["losses"][-1] == expected                      # bit-exact
    with pytest.raises(ProcessLookupError):             # nothing of the job is left
        os.killpg(proc.pid, 0)


def test_a_rank_waiting_past_the_timeout_says_for_what(tmp_path):
    """Rank 0 of 2 joins under torchrun's variables; rank 1 never comes. Within --timeout
    (2 s) plus start-up the watchdog names what it waited for and the fix, and exits 124."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", RANK="0",
               WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    code = "from lecture_lib.capstone import elastic; elastic.torchrun_main(print, timeout=2)"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == elastic.EXIT_TIMEOUT, proc.stderr[-3000:]
    assert time.monotonic() - start < 60
    assert "rank 0 (restart 0): waited more than 2 s (--timeout) for the process group: " \
        f"all 2 ranks joining through the store at 127.0.0.1:{port}" in proc.stderr
    assert "Fix: start every rank" in proc.stderr and "in join_group" in proc.stderr


def test_fail_at_needs_a_checkpoint_before_it(cfg, tmp_path, monkeypatch):
    """Without a checkpoint before --fail-at the restart silently trained from step 0."""
    def no_ranks(*args, **kwargs):
        raise AssertionError("a process or a group was started")
    monkeypatch.setattr(launch, "run", no_ranks)
    monkeypatch.setattr(cli, "torchrun_main", no_ranks)
    ck = str(tmp_path / "ck")
    with pytest.raises(ValueError, match="fail_at=3 needs checkpoint_every >= 1"):
        train(cfg, dims=DP2, checkpoint_dir=ck, fail_at=3, fail_rank=1)
    with pytest.raises(ValueError, match=r"fail_at must be in \[checkpoint_every, steps\) "
                                         r"= \[2, 4\), not 1"):
        train(cfg, dims=DP2, checkpoint_dir=ck, checkpoint_every=2, fail_at=1)
    with pytest.raises(ValueError, match="= \\[2, 4\\), not 4"):
        train(cfg, dims=DP2, checkpoint_dir=ck, checkpoint_every=2, fail_at=4)
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)                 # as under torchrun
    with pytest.raises(ValueError, match="fail_at=3 needs checkpoint_every >= 1"):
        cli_main(["--tokens", cfg.tokens, "--vocab-size", "30", "--steps", "4",
                  "--checkpoint-dir", ck, "--fail-at", "3", "--fail-rank", "1"])
    assert not Path(ck).exists()


def test_bad_input_before_any_process(cfg, tmp_path, monkeypatch):
    def no_ranks(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(launch, "run", no_ranks)
    with pytest.raises(ValueError, match="unknown strategy 'zero4'"):
        train(cfg, strategy="zero4", dims=DP2)
    with pytest.raises(ValueError, match="has 4 ranks but world_size is 2"):
        check_config(TrainConfig(MODEL, cfg.tokens, strategy="3d",
                                 dims=ParallelDims(dp=2, tp=2)), world_size=2)
    with pytest.raises(ValueError, match="has 4 ranks but world_size is 2"):
        cli_main(["--strategy", "3d", "--dp", "2", "--tp", "2", "--world-size", "2",
                  "--tokens", cfg.tokens, "--vocab-size", "30"])
    with pytest.raises(ValueError, match="data-parallel ranks only"):
        train(cfg, strategy="fsdp", dims=ParallelDims(tp=2))
    with pytest.raises(ValueError, match="fail_at needs a checkpoint_dir"):
        train(cfg, fail_at=2)
    other = tmp_path / "step_000004"                    # a checkpoint of another model
    other.mkdir()
    meta = {"model": dict(MODEL.__dict__, d_model=64), "global_batch": 8, "data_seed": 0}
    (other / checkpoint.META).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="of another model: d_model=64 \\(this run 32\\)"):
        train(cfg, strategy="ddp", dims=DP2, checkpoint_dir=str(tmp_path))


def test_mfu_counts_the_models_flops():
    gpt = GPT(MODEL, 0)
    n = non_embedding_params(MODEL)
    assert metrics.model_flops_per_token(n, MODEL.n_layers, MODEL.seq_len, MODEL.d_model) \
        == metrics.gpt_flops_per_token(gpt)


def test_emulated_run_has_the_same_losses_and_a_deterministic_virtual_time(cfg, uninterrupted):
    runs = [train(cfg, timeout=120, emulate="h100-node", peak_flops=None, **RUNS["ddp"])
            for _ in range(2)]
    assert runs[0]["losses"] == uninterrupted("ddp")          # the same bits, only timed
    assert runs[0]["time_kind"] == "emulated H100 + NVLink"
    assert runs[0]["step_seconds"] == runs[1]["step_seconds"]  # virtual time: no noise
    assert 0 < runs[0]["comm_seconds"] < sum(runs[0]["step_seconds"])
    assert runs[0]["peak_flops"] == lecture_lib.emulate.preset("h100-node").flops(torch.float32)


def test_emulation_refuses_unknown_presets_and_checkpoints_before_any_process(cfg, tmp_path):
    with pytest.raises(ValueError, match="unknown emulation preset 'tpu'"):
        check_config(TrainConfig(MODEL, cfg.tokens, emulate="tpu"))
    with pytest.raises(ValueError, match="emulate runs neither checkpoints"):
        check_config(TrainConfig(MODEL, cfg.tokens, emulate="h100-node",
                                 checkpoint_dir=str(tmp_path)))


def test_quiet_prints_no_progress_lines_but_keeps_the_rows(cfg, uninterrupted, capfd):
    loud = train(cfg, timeout=120, **RUNS["ddp"])
    assert "tok/s" in capfd.readouterr().out                 # the progress line
    quiet = train(cfg, timeout=120, quiet=True, **RUNS["ddp"])
    assert "tok/s" not in capfd.readouterr().out
    assert quiet["losses"] == loud["losses"] == uninterrupted("ddp")
    assert [r["step"] for r in quiet["log"]] == [r["step"] for r in loud["log"]]
