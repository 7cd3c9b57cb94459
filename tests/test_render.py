"""tools/render_notebooks.py (make render): a time limit per notebook that names the slow cell,
and the widget state stored in the HTML."""
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
               "import ipywidgets as w\nw.IntSlider(value=7, description='seven')",
               "import os\nprint('progress:', os.environ['LECTURE_LIB_PROGRESS'])")
    done = render(tmp_path, nb)
    assert done.returncode == 0, done.stdout + done.stderr
    html = (tmp_path / "html" / "widget.html").read_text()
    assert "application/vnd.jupyter.widget-state+json" in html and '"seven"' in html
    assert "progress: lines" in html
    assert not nbformat.read(nb, 4).cells[0].outputs            # the source stays unexecuted
