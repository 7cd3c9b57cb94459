"""The capstone notebook: the hand calculations, with the library's models.

Q2: storing the tokens. Q3: the compute of the course's GPT-2 small (MFU's ``N``, 123.7M:
``GPTConfig.num_params(embeddings=False)``, its 163M parameters less the token and position
embedding tables, the untied output layer counted; L 12 layers, h 768, s 1024) on D = 10
billion tokens (``metrics.model_flops_per_token``: ``6 N`` plus the attention term
``12 L s h``), and how long it takes at 40 % MFU on one A100 and on one node of 8 H100 (peaks
from ``costmodel``: 312 and 989 TFLOP/s dense bf16). Q5 (what if): :func:`emulated_step`, the
notebook's one-process step in emulated time (``emulate``'s ``h100-node``, eager), at the
notebook's batch and 8 times it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from lecture_lib import metrics
from lecture_lib.capstone import launches
from lecture_lib.capstone.experiments import DEFAULT_RUNS
from lecture_lib.capstone.predict import modelled_memory, strategy_layout
from lecture_lib.capstone.report import format_table
from lecture_lib.capstone.strategies import run_recipe
from lecture_lib.capstone.train import cpu_gpt
from lecture_lib.costmodel import A100_CLUSTER, H100_CLUSTER
from lecture_lib.models import REAL_SIZE
from lecture_lib.study import fmt

TOKENS = 10_000_000_000
_GPT2 = REAL_SIZE["GPT-2 small"]
GPT2_SMALL = {"n_params": _GPT2.num_params(embeddings=False), "n_layers": _GPT2.n_layers,
              "seq_len": _GPT2.seq_len, "d_model": _GPT2.d_model}
MFU = 0.4
VOCAB, BATCH, LR = 1024, 8, 2e-3     # the notebook's vocabulary, batch and learning rate


def q2() -> list[str]:
    """10 B token ids: uint16 (vocab 50257 < 65536) against int64."""
    return [fmt(TOKENS * 2 / 1e9, "GB"), fmt(TOKENS * 8 / 1e9, "GB")]


def training_seconds(flops: float, peak: float, devices: int, mfu: float = MFU) -> float:
    """Time for `flops` model FLOPs on `devices` of `peak` FLOP/s each at `mfu`."""
    seconds = flops / (peak * devices * mfu)
    rate = TOKENS / seconds  # tokens/s, checked against the library's own MFU formula
    flops_per_token = flops / TOKENS
    assert abs(metrics.mfu(rate, flops_per_token, peak, devices) - mfu) < 1e-9
    return seconds


def q3() -> list[str]:
    six_n = metrics.model_flops_per_token(GPT2_SMALL["n_params"])
    per_token = metrics.model_flops_per_token(**GPT2_SMALL)
    total = per_token * TOKENS
    a100 = training_seconds(total, A100_CLUSTER.peak_flops, 1)
    h100 = training_seconds(total, H100_CLUSTER.peak_flops, 8)
    return [fmt(GPT2_SMALL["n_params"] / 1e6, "million", 4), fmt(six_n * TOKENS, "FLOP"),
            fmt(per_token * TOKENS, "FLOP"),
            f"{(per_token - six_n) / six_n:.0%}", fmt(a100 / 86400, "days"),
            fmt(h100 / 3600, "hours")]


def emulated_step(batch: int) -> float:
    """Emulated seconds of a forward + backward + AdamW step of the notebook's model on
    ``batch`` sequences laid out as its loader gives them, on the ``h100-node`` preset (eager):
    ``capstone.launches.emulated_step``, the function the notebook's table runs. Emulated time
    depends on shapes and layouts only, not on the token values."""
    cfg = cpu_gpt(VOCAB)
    x, y = launches.loader_layout_batch(cfg, batch)
    return launches.emulated_step(cfg, x, y, "h100-node", lr=LR)["step"]


def q5() -> list[str]:
    """The emulated step with 8 and 64 sequences, and how much longer the second is."""
    small, large = emulated_step(BATCH), emulated_step(8 * BATCH)
    return [fmt(small * 1e3, "ms"), fmt(large * 1e3, "ms"), f"{large / small - 1:.0%}"]


ANSWERS = {"Q2": q2, "Q3": q3, "Q5": q5}


def strategy_runs(val_tokens) -> dict[str, dict]:
    """``experiments.DEFAULT_RUNS`` (one process, then each strategy on 2 ranks, 3d on 4), the
    one-process run also scoring the validation tokens at ``val_tokens``."""
    one = dict(DEFAULT_RUNS["1 process"], val_tokens=str(val_tokens))
    return {**DEFAULT_RUNS, "1 process": one}


def prediction_table(predicted: dict[str, dict]) -> str:
    """The rows of ``report.format_table`` for the records ``{strategy: record}``, without its
    last line (the settings, which the notebook prints itself)."""
    return "\n".join(format_table(list(predicted.values())).splitlines()[:-1])


def collective_calls(run: dict, rank: int = 0) -> dict[str, tuple[int, float]]:
    """The collectives that carried bytes on ``rank`` of a capstone run (its ``comm`` record,
    ``{phase: {kind: (calls, buffer bytes)}}``), summed over the phases: kind -> (calls, MB)."""
    calls: dict[str, tuple[int, float]] = {}
    for kinds in run["comm"][rank].values():
        for kind, (count, nbytes) in kinds.items():
            if nbytes:
                c, b = calls.get(kind, (0, 0.0))
                calls[kind] = (c + count, b + nbytes / 1e6)
    return calls


def plot_resume_and_reshard(uninterrupted: list[float], resumed: dict, before: list[float],
                            resharded: dict[str, list[float]], fail_at: int,
                            fsdp_uninterrupted: list[float]):
    """The notebook's first picture, two panels on one loss axis. Left: the ``ddp`` run killed
    at ``fail_at`` and resumed (``resumed``: its ``first_step`` and ``losses``; hollow circles)
    on the uninterrupted ``ddp`` run (``uninterrupted``, grey line). Right: FSDP on 4 ranks for
    its first steps (``before``), then its checkpoint continued under each layout of
    ``resharded`` (``{name: losses}``), on the uninterrupted FSDP run (``fsdp_uninterrupted``,
    grey line)."""
    steps, first = len(uninterrupted), resumed["first_step"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
    for ax, line, name in zip(axes, (uninterrupted, fsdp_uninterrupted), ("ddp 2", "fsdp 4")):
        ax.plot(range(steps), line, color="black", linewidth=3, alpha=0.3,
                label=f"uninterrupted {name}")
        ax.set_xlabel("step")
    left, right = axes
    left.plot(range(first, steps), resumed["losses"], "o", color="C3", markersize=9,
              markerfacecolor="none", label="killed, resumed")
    left.axvline(fail_at, color="C3", linestyle=":", label=f"SIGKILL, step {fail_at}")
    left.axvline(first, color="0.5", linestyle="--", label=f"resumed from step {first}")
    left.set_title("Killed and resumed: the same losses")
    left.set_ylabel("training loss (nats/token)")
    half = len(before)
    right.plot(range(half), before, "s", color="C0", markersize=5, label="fsdp 4, stopped")
    for i, (target, losses) in enumerate(resharded.items()):   # a large hollow, a small filled
        right.plot(range(half, steps), losses, "^v"[i], color=f"C{i + 1}",
                   markersize=[9, 4][i], markerfacecolor=["none", f"C{i + 1}"][i],
                   label=f"then {target}")
    right.set_title("Resharded at a checkpoint: the same losses")
    for ax in axes:                                          # below each panel, off the data
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8)
    fig.subplots_adjust(bottom=0.36, wspace=0.08)
    return fig


def memory_parts(row: dict) -> dict:
    """The memory column of a predicted ``row`` (:func:`~lecture_lib.capstone.predict.predict`)
    by kind, in bytes: params, grads, optimizer, activations and total, from the same memory
    model at the row's layout, ZeRO stage and micro-batch size."""
    model = REAL_SIZE["GPT-2 small"]
    dims, recipe = strategy_layout(row["strategy"], row["world_size"], model)
    return modelled_memory(model, dims, run_recipe(row["strategy"], recipe).zero_stage,
                           row["settings"]["micro-batch size"])
