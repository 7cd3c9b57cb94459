"""Measured against predicted: ``python -m lecture_lib.capstone compare A.json B.json ...``.

Each file is what the trainer wrote to ``--out``: one record of a run (real, or emulated),
or the list of records of a prediction (``--emulate PRESET --dry-run``); every record has
the fields of :data:`.report.FIELDS`. The plot has one group of bars per strategy and
world size, a bar per source (the file's time kind and hardware: ``real`` on ``CPU (2
cores), 2 ranks, gloo``; ``emulated H100 + NVLink (dry run)`` on ``8 x ...``), the step
time on a linear axis, error bars only where a source has a spread, the legend outside the
bars and the course's stamp (measured or emulated) in the corner; the caption states how
each source timed its step (warm-up steps dropped, how many steps, the spread); the printed
method adds which peak its MFU is against.
"""
from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

from .report import FIELDS


def load_records(paths) -> list[dict]:
    """Every record in the files, each with ``source`` (its file's name) added."""
    records = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        for r in data if isinstance(data, list) else [data]:
            missing = [f for f in FIELDS if f not in r]
            if missing:
                raise ValueError(f"{path}: a record without {', '.join(missing)}: was it "
                                 "written by examples/train_gpt2.py --out?")
            records.append({**r, "source": Path(path).name})
    return records


def kind(record: dict) -> str:
    """``"measured"`` for real time, ``"predicted"`` for emulated or modelled time."""
    return "measured" if record["time_kind"] == "real" else "predicted"


def compare(paths, png: str | None = None) -> dict:
    """Draw the records of ``paths`` side by side; ``{"groups", "sources", "ratios", "png",
    "method"}``: ``ratios`` is measured over predicted step time per group that has both."""
    import matplotlib  # noqa: PLC0415  (only the plot needs it)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from lecture_lib.figures import plots  # noqa: PLC0415

    records = load_records(paths)
    groups = sorted({(r["strategy"], r["world_size"]) for r in records},
                    key=lambda g: (g[1], g[0]))
    sources = list(dict.fromkeys((kind(r), r["time_kind"], r["hardware"]) for r in records))
    plots.use_style()
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(groups) + 3), 4.0))
    width = 0.8 / len(sources)
    for i, source in enumerate(sources):
        xs, ys, spread = [], [], [[], []]
        for j, group in enumerate(groups):
            found = [r for r in records if (r["strategy"], r["world_size"]) == group
                     and (kind(r), r["time_kind"], r["hardware"]) == source]
            if found:
                step, (low, high) = found[0]["step_time"], found[0]["step_time_spread"]
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(step * 1e3)
                spread[0].append((step - low) * 1e3)
                spread[1].append((high - step) * 1e3)
        ax.bar(xs, ys, width, yerr=spread if any(spread[0] + spread[1]) else None, capsize=3,
               color=f"C{i}", edgecolor="white",
               hatch=None if source[0] == "measured" else "//",
               label=textwrap.fill(f"{source[0]}: {source[1]}, on {source[2]}", 36))
    ax.set_xticks(range(len(groups)), [f"{s}\n{w} ranks" for s, w in groups])
    ax.set_ylabel("step time (ms)")
    both = {kind(r) for r in records} == {"measured", "predicted"}
    ax.set_title(("Measured against predicted step time" if both else "Step time") +
                 ", per strategy" + (" (error bars: min-max of the timed steps)" if any(
                     r["step_time_spread"][0] < r["step_time_spread"][1] for r in records)
                     else ""), fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    method = timing_method(records)
    caption = "\n".join(textwrap.fill(line, 90) for line in _caption(records))
    fig.text(0.01, -0.08, caption, fontsize=6.5, color="0.3", va="top")
    plots.stamp(fig, text="\n".join(dict.fromkeys(
        "measured (real time)" if r["time_kind"] == "real" else r["time_kind"] for r in records)))
    fig.texts[-1].set(position=(0.99, -0.08), va="top")     # under the axis, beside the caption
    out = png or "compare.png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return {"groups": groups, "sources": sources, "ratios": _ratios(records, groups),
            "png": out, "method": method}


def timing_method(records: list[dict]) -> list[str]:
    """One line per source: its time kind, how it timed a step, and MFU's peak."""
    seen = {}
    for r in records:
        seen.setdefault(r["source"] + r["time_kind"],
                        f"{r['source']} ({r['time_kind']}): {r['timing']}; MFU against "
                        f"{r['peak']}")
    return list(seen.values())


def _caption(records: list[dict]) -> list[str]:
    """One line per way of timing a step, with the files timed that way (the plot shows step
    time, so MFU's peak is left to the printed method)."""
    files = {}
    for r in records:
        files.setdefault((r["time_kind"], r["timing"]), []).append(r["source"])
    return [f"{', '.join(dict.fromkeys(names))} ({time_kind}): {timing}"
            for (time_kind, timing), names in files.items()]


def _ratios(records: list[dict], groups) -> dict:
    """Measured over predicted step time, per group with both; None where the two are not
    the same run (another model, batch or recipe): then no ratio means anything."""
    out = {}
    for group in groups:
        mine = [r for r in records if (r["strategy"], r["world_size"]) == group]
        measured = [r for r in mine if kind(r) == "measured"]
        predicted = [r for r in mine if kind(r) == "predicted"]
        if measured and predicted:
            same = all(measured[0][k] == predicted[0][k]
                       for k in ("model", "global_batch", "seq_len", "layout")) and all(
                measured[0]["settings"][k] == predicted[0]["settings"][k]
                for k in ("micro-batches", "micro-batch size"))
            out[group] = measured[0]["step_time"] / predicted[0]["step_time"] if same else None
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m lecture_lib.capstone compare",
                                description="Measured against predicted step time.")
    p.add_argument("files", nargs="+", help="JSON written by examples/train_gpt2.py --out")
    p.add_argument("--png", default="compare.png", help="where to draw it")
    args = p.parse_args(argv)
    result = compare(args.files, args.png)
    for line in result["method"]:
        print(line)
    for (strategy, world), ratio in result["ratios"].items():
        print(f"{strategy} on {world}: " + (
            "measured and predicted are not the same run (model, batch or recipe differ)"
            if ratio is None else f"measured / predicted step time = {ratio:.3g}"))
    print(f"drawn: {result['png']}")
    return result
