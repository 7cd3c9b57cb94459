"""Reproduce the render stall without lecture_lib: an ipywidgets Output widget under nbclient.

A widget whose observer draws into an ``Output`` widget (``with out: display(fig)``) makes
nbclient (what ``jupyter nbconvert --execute`` runs) send a ``comm_msg`` on the kernel's
*shell* channel (``OutputWidget.sync_state``) while another task of nbclient waits on the
same channel for the cell's ``execute_reply``. Now and then that wait never wakes up,
although the kernel has replied and is idle; it ends only at the cell timeout, when a
final poll finds the reply, so the notebook still "succeeds", minutes late (upstream:
jupyter/nbclient#312 and PR #311). Drawing into an ``Image`` widget instead sends
nothing back to the kernel, and does not stall.

    python tools/repro_widget_stall.py --runs 12 --timeout 30 --variant output
    python tools/repro_widget_stall.py --runs 12 --timeout 30 --variant image

Each run executes a fresh two-cell notebook in a fresh kernel and prints the slowest cell's
seconds; a run whose slowest cell took about ``--timeout`` seconds stalled.
"""
from __future__ import annotations

import argparse
import time

import nbformat
from nbclient import NotebookClient

SETUP = """
import io
import ipywidgets as w
import matplotlib
matplotlib.use("agg")
import matplotlib.pyplot as plt
from IPython.display import display

slider = w.IntSlider(value=1, min=1, max=50)
out, image = w.Output(), w.Image(format="png")

def draw(n):
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(range(n), range(n))
    return fig

def update(*_):
    fig = draw(slider.value)
    if VARIANT == "output":              # the old explorer: capture output in an Output widget
        out.clear_output(wait=True)
        with out:
            print("value", slider.value)
            display(fig)
    else:                                # the new explorer: PNG bytes into an Image widget
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        image.value = buffer.getvalue()
    plt.close(fig)

slider.observe(update, names="value")
update()
w.VBox([slider, out if VARIANT == "output" else image])
"""
CHANGE = "for v in (2, 8, 32, 4):\n    slider.value = v\n"


def one_run(variant: str, timeout: float) -> list[float]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"VARIANT = {variant!r}\n" + SETUP),
                nbformat.v4.new_code_cell(CHANGE)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    seconds = []
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3")
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            start = time.monotonic()
            client.execute_cell(cell, index)
            seconds.append(time.monotonic() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=30.0, help="nbclient's cell timeout")
    parser.add_argument("--variant", choices=("output", "image"), default="output")
    args = parser.parse_args()
    stalled = 0
    for run in range(1, args.runs + 1):
        seconds = one_run(args.variant, args.timeout)
        slow = max(seconds) >= 0.9 * args.timeout
        stalled += slow
        print(f"run {run}: cells took {', '.join(f'{s:.1f}' for s in seconds)} s"
              + ("  <- stalled until the cell timeout" if slow else ""), flush=True)
    print(f"{args.variant}: {stalled} of {args.runs} runs stalled "
          f"(cell timeout {args.timeout:g} s)")


if __name__ == "__main__":
    main()
