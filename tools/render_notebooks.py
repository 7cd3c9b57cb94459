"""Execute notebooks one by one and write each, with its outputs and widgets, as HTML.

What ``make render`` runs (the headless variant of ``make course``). Beyond
``jupyter nbconvert --execute`` it

* times every cell and prints the slowest ones of each notebook, so a slow or
  stuck cell is named (notebook, cell number, first line, seconds);
* gives each notebook a time limit (``--notebook-timeout``) as well as each cell
  (``--cell-timeout``): a cell runs at most for what is left of its notebook's
  budget; past it the notebook is reported as too slow and the next one starts;
* stores the widget state in the notebook, so that the HTML shows the
  explorers' controls and figures instead of blank boxes (the HTML loads the
  widget manager from a CDN, so widgets need a network connection to draw);
* runs the kernel with ``LECTURE_LIB_PROGRESS=lines``: progress as plain lines,
  which the HTML can show.

It does not import lecture_lib. The committed notebooks are not modified: each
is read, executed in memory (working directory: its own folder) and written
only as HTML. Exit status 1 when any notebook failed or ran past its limit.

    python tools/render_notebooks.py --output-dir build/notebooks notebooks/*.ipynb
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbconvert import HTMLExporter


def first_line(cell) -> str:
    lines = [line for line in cell.source.splitlines() if line.strip()]
    return (lines[0][:70] + ("..." if len(lines) > 1 else "")) if lines else "(empty)"


def execute(path: Path, cell_timeout: float, notebook_timeout: float):
    """Run one notebook; return (notebook, [(cell index, seconds)], problem or None)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                            store_widget_state=True, record_timing=True,
                            resources={"metadata": {"path": str(path.parent)}})
    deadline = time.monotonic() + notebook_timeout
    client.timeout_func = lambda cell: max(1, int(min(cell_timeout, deadline - time.monotonic())))
    timings, problem = [], None
    with client.setup_kernel():
        client.wait_for_reply(client.kc.kernel_info())
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            start = time.monotonic()
            try:
                client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
            except CellTimeoutError:
                seconds = time.monotonic() - start
                timings.append((index, seconds))
                limit = (f"notebook's {notebook_timeout:g} s" if time.monotonic() >= deadline - 1
                         else f"cell's {cell_timeout:g} s")
                problem = f"cell {index} ({first_line(cell)}) ran {seconds:.0f} s, past the {limit}"
                break
            except (CellExecutionError, DeadKernelError) as exc:
                timings.append((index, time.monotonic() - start))
                problem = f"cell {index} ({first_line(cell)}) failed: {str(exc).splitlines()[-1:]}"
                break
            timings.append((index, time.monotonic() - start))
        client.set_widgets_metadata()
    return nb, timings, problem


def report(path: Path, nb, timings, problem, slowest: int) -> str:
    total = sum(s for _, s in timings)
    lines = [f"{path.name}: {total:.0f} s over {len(timings)} code cells"
             + (f"  FAILED: {problem}" if problem else "")]
    for index, seconds in sorted(timings, key=lambda t: -t[1])[:slowest]:
        lines.append(f"    cell {index:3d} {seconds:7.1f} s   {first_line(nb.cells[index])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--output-dir", type=Path, default=Path("build/notebooks"))
    parser.add_argument("--cell-timeout", type=float, default=300.0)
    parser.add_argument("--notebook-timeout", type=float, default=600.0)
    parser.add_argument("--slowest", type=int, default=3, help="cells listed per notebook")
    args = parser.parse_args(argv)
    os.environ.setdefault("LECTURE_LIB_PROGRESS", "lines")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    failed, start = [], time.monotonic()
    for path in args.notebooks:
        print(f"executing {path} ...", flush=True)
        nb, timings, problem = execute(path, args.cell_timeout, args.notebook_timeout)
        html, _ = HTMLExporter().from_notebook_node(nb)
        (args.output_dir / f"{path.stem}.html").write_text(html, encoding="utf-8")
        print(report(path, nb, timings, problem, args.slowest), flush=True)
        if problem:
            failed.append(path.name)
    print(f"rendered {len(args.notebooks) - len(failed)} of {len(args.notebooks)} notebooks into "
          f"{args.output_dir}/ in {time.monotonic() - start:.0f} s"
          + (f"; failed or too slow: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
