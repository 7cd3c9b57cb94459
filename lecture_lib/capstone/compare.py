"""Measured against predicted: ``python -m lecture_lib.capstone compare A.json B.json ...``.

Each file is what the trainer wrote to ``--out``: one record of a run (real, or emulated),
or the list of records of a prediction (``--emulate PRESET --dry-run``); every record has
the fields of :data:`.report.FIELDS`. The plot has one group of bars per strategy and
world size, in the order of the files (the table's order), a bar per source, labelled by its
hardware and whether it was measured or emulated (``H100 SXM (emulated)``), the step time on
a linear axis with each bar's value printed on it, error bars only where a source has a
spread, the legend outside the bars and one stamp (measured, emulated or both) in the corner.
How each source timed its step and which peak its MFU is against are printed, once, not drawn.
"""
from __future__ import annotations

import argparse
import json
import re
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


#: The course's plot style (lecture_lib.figures.plots.use_style; that layer sits above this one).
STYLE = {"axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
         "axes.spines.right": False, "font.size": 10, "legend.frameon": False}


def kind(record: dict) -> str:
    """``"measured"`` for real time, ``"predicted"`` for emulated or modelled time."""
    return "measured" if record["time_kind"] == "real" else "predicted"


def compare(paths, png: str | None = None, title: str | None = None) -> dict:
    """Draw the records of ``paths`` side by side; ``{"groups", "sources", "ratios", "png",
    "method", "title"}``: ``ratios`` is measured over predicted step time per group that has both.
    ``title`` replaces the default title (the figure's message, when the caller knows it)."""
    import matplotlib  # noqa: PLC0415  (only the plot needs it)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    records = load_records(paths)
    groups = list(dict.fromkeys((r["strategy"], r["world_size"]) for r in records))
    sources = list(dict.fromkeys((kind(r), r["time_kind"], r["hardware"]) for r in records))
    plt.rcParams.update(STYLE)
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
        bars = ax.bar(xs, ys, width, yerr=spread if any(spread[0] + spread[1]) else None,
                      capsize=3, color=f"C{i}", edgecolor="white", label=short_label(*source))
        ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=7, padding=2)
    ax.set_xticks(range(len(groups)), [f"{s}\n{w} ranks" for s, w in groups])
    ax.set_ylabel("step time (ms)")
    both = {kind(r) for r in records} == {"measured", "predicted"}
    default = (("Measured against predicted step time" if both else
                f"{kind(records[0]).capitalize()} step time") +
               ", per strategy" + (" (error bars: min-max of the timed steps)" if any(
                   r["step_time_spread"][0] < r["step_time_spread"][1] for r in records)
                   else ""))
    ax.set_title(title or default, fontsize=10)
    ax.margins(y=0.12)                                                  # room for the values
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    method = timing_method(records)
    fig.text(0.99, 0.005, " and ".join(dict.fromkeys(stamp_kind(r) for r in records)),
             ha="right", va="bottom", fontsize=8, color="0.4")      # the course's stamp
    fig.subplots_adjust(bottom=0.22)
    out = png or "compare.png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return {"groups": groups, "sources": sources, "ratios": _ratios(records, groups),
            "png": out, "method": method, "title": title or default}


def timing_method(records: list[dict]) -> list[str]:
    """One line per source: its time kind, how it timed a step, and MFU's peak."""
    seen = {}
    for r in records:
        seen.setdefault(r["source"] + r["time_kind"],
                        f"{r['source']} ({r['time_kind']}): {r['timing']}; MFU against "
                        f"{r['peak']}")
    return list(seen.values())


def stamp_kind(record: dict) -> str:
    """The stamp's word for a record's time: measured, emulated or modelled."""
    if record["time_kind"] == "real":
        return "measured (real time)"
    return "emulated (dry run)" if record["time_kind"].startswith("emulated") else "modelled"


def short_label(kind_: str, time_kind: str, hardware: str) -> str:
    """A source's legend label: its device and how its time was got, ``H100 SXM (emulated)``
    from ``4 x H100 SXM, 8 per node``, ``CPU (2 cores), measured`` from a real CPU run."""
    device = re.sub(r"^\d+\s*x\s*", "", hardware.split(",")[0]).strip()
    how = "measured" if kind_ == "measured" else time_kind.split()[0]
    return f"{device}, {how}" if "(" in device else f"{device} ({how})"


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
    p.add_argument("--title", default=None, help="the figure's title (default: what it shows)")
    args = p.parse_args(argv)
    result = compare(args.files, args.png, args.title)
    for line in result["method"]:
        print(line)
    for (strategy, world), ratio in result["ratios"].items():
        print(f"{strategy} on {world}: " + (
            "measured and predicted are not the same run (model, batch or recipe differ)"
            if ratio is None else f"measured / predicted step time = {ratio:.3g}"))
    print(f"drawn: {result['png']}")
    return result
