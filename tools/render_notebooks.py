"""Execute notebooks one by one and write each, with its outputs and widgets, as HTML.

What ``make render`` runs (the headless variant of ``make course``). Beyond
``jupyter nbconvert --execute`` it

* times every cell and prints the slowest ones of each notebook, so a slow or
  stuck cell is named (notebook, cell number, first line, seconds);
* gives each notebook a time limit (``--notebook-timeout``) as well as each cell
  (``--cell-timeout``): a cell runs at most for what is left of its notebook's
  budget; past it the notebook is reported as too slow and the next one starts;
* stores the widget state in the notebook, so that the HTML shows the
  explorers' controls and figures instead of blank boxes. The live widget needs
  the widget manager, which the HTML loads from a CDN (no copy of
  @jupyter-widgets/html-manager ships with the Python packages: jupyterlab_widgets
  holds a JupyterLab federated bundle, widgetsnbextension a classic-notebook
  one), so after each widget the HTML also shows a *static snapshot* of it as
  executed (:func:`add_widget_snapshots`): its controls and values, HTML and
  images drawn from the stored state, readable offline;
* runs the kernel with ``LECTURE_LIB_PROGRESS=lines``: progress as plain lines,
  which the HTML can show.

It does not import lecture_lib. The committed notebooks are not modified: each
is read, executed in memory (working directory: its own folder) and written
only as HTML. Exit status 1 when any notebook failed or ran past its limit.

    python tools/render_notebooks.py --output-dir build/notebooks notebooks/*.ipynb
"""
from __future__ import annotations

import argparse
import html
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbconvert import HTMLExporter

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
BOXES = ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel", "AccordionModel", "TabModel")
SNAPSHOT_NOTE = ("static snapshot of the widget above, as executed (readable offline; the live "
                 "widget needs its JavaScript from a CDN)")


def widget_html(model_id: str, state: dict) -> str:
    """HTML for one stored widget model and its children: boxes as flex rows/columns, HTML
    as itself, images from their base64 buffers, controls as 'description: value'."""
    model = state.get(model_id.removeprefix("IPY_MODEL_"))
    if model is None:
        return ""
    name, values = model.get("model_name", ""), model.get("state", {})
    if name in BOXES:
        direction = "column" if name == "VBoxModel" else "row"
        inner = "".join(f"<div>{widget_html(c, state)}</div>" for c in values.get("children", []))
        return f'<div style="display:flex;flex-direction:{direction};gap:4px 16px">{inner}</div>'
    if name in ("HTMLModel", "HTMLMathModel"):
        return values.get("value", "")
    if name == "ImageModel":
        data = next((b["data"] for b in model.get("buffers", []) if b.get("path") == ["value"]),
                    None)
        fmt = values.get("format", "png")
        return f'<img src="data:image/{fmt};base64,{data}"/>' if data else ""
    if name == "OutputModel":
        return "".join(_output_html(o) for o in values.get("outputs", []))
    value = values.get("value")
    if "_options_labels" in values and values.get("index") is not None:
        value = values["_options_labels"][values["index"]]
    if value is None and not values.get("description"):
        return ""
    label = html.escape(str(values.get("description", "")))
    return f"<span><b>{label}</b> {html.escape(str(value))}</span>"


def _output_html(output: dict) -> str:
    data = output.get("data", {})
    if "image/png" in data:
        return f'<img src="data:image/png;base64,{data["image/png"]}"/>'
    if "text/html" in data:
        return "".join(data["text/html"])
    text = output.get("text") or "".join(data.get("text/plain", ""))
    return f"<pre>{html.escape(''.join(text))}</pre>" if text else ""


def add_widget_snapshots(nb) -> int:
    """After every widget output whose state is stored, add a display_data output with its
    static snapshot as HTML; returns how many were added."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    added = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for output in cell.get("outputs", []):
            outputs.append(output)
            view = output.get("data", {}).get(WIDGET_VIEW)
            body = widget_html(view["model_id"], state) if view else ""
            if body:
                outputs.append(nbformat.v4.new_output(
                    "display_data", data={"text/html": (
                        f'<div class="widget-snapshot" style="border:1px dashed #999;'
                        f'padding:6px"><div style="color:#666;font-size:small">{SNAPSHOT_NOTE}'
                        f"</div>{body}</div>")}))
                added += 1
        cell.outputs = outputs
    return added


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
    add_widget_snapshots(nb)
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
