"""tools/render_notebooks.py (make render): a time limit per notebook that names the slow cell,
and the widget state stored in the HTML."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
RENDER = ROOT / "tools" / "render_notebooks.py"


def write(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def render(tmp_path, *args):
    return subprocess.run([sys.executable, str(RENDER), "--output-dir", str(tmp_path / "html"),
                           *map(str, args)], capture_output=True, text=True, timeout=240)


def test_a_notebook_past_its_limit_is_reported_with_its_slow_cell(tmp_path):
    slow = write(tmp_path / "slow.ipynb", "x = 1", "import time\ntime.sleep(120)", "y = 2")
    done = render(tmp_path, "--notebook-timeout", "8", slow)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "slow.ipynb" in done.stdout and "FAILED: cell 1 (import time..." in done.stdout
    assert "past the notebook's 8 s" in done.stdout
    assert "failed or too slow: slow.ipynb" in done.stdout
    assert (tmp_path / "html" / "slow.html").exists()


def test_widgets_are_stored_and_progress_is_lines(tmp_path):
    nb = write(tmp_path / "widget.ipynb",
               "import ipywidgets as w\nw.VBox([w.IntSlider(value=7, description='seven'),"
               " w.HTML('<i>drawn here</i>')])",
               "import os\nprint('progress:', os.environ['LECTURE_LIB_PROGRESS'])")
    done = render(tmp_path, nb)
    assert done.returncode == 0, done.stdout + done.stderr
    html = (tmp_path / "html" / "widget.html").read_text()
    assert "application/vnd.jupyter.widget-state+json" in html and '"seven"' in html
    assert "progress: lines" in html
    snapshot = html[html.index('class="widget-snapshot"'):]     # offline: the static snapshot
    assert "<b>seven</b> 7" in snapshot and "<i>drawn here</i>" in snapshot
    assert not nbformat.read(nb, 4).cells[0].outputs            # the source stays unexecuted


def _render_module():
    spec = importlib.util.spec_from_file_location("render_notebooks", RENDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_widget_snapshot_draws_boxes_controls_and_images_from_the_stored_state():
    render_notebooks = _render_module()
    state = {
        "box": {"model_name": "VBoxModel",
                "state": {"children": ["IPY_MODEL_pick", "IPY_MODEL_img"]}},
        "pick": {"model_name": "DropdownModel",
                 "state": {"description": "model", "_options_labels": ["A", "B"], "index": 1}},
        "img": {"model_name": "ImageModel", "state": {"format": "png"},
                "buffers": [{"path": ["value"], "data": "iVBORw0K", "encoding": "base64"}]},
    }
    html = render_notebooks.widget_html("IPY_MODEL_box", state)
    assert "flex-direction:column" in html
    assert "<b>model</b> B" in html
    assert '<img src="data:image/png;base64,iVBORw0K"/>' in html
    assert render_notebooks.widget_html("missing", state) == ""

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("panel")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "VBox()", render_notebooks.WIDGET_VIEW: {"model_id": "box"}})]
    nb.cells = [cell]
    nb.metadata["widgets"] = {render_notebooks.WIDGET_STATE: {"state": state}}
    assert render_notebooks.add_widget_snapshots(nb) == 1
    assert "widget-snapshot" in nb.cells[0].outputs[1]["data"]["text/html"]
