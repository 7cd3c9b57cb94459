"""The course as a student sees it: JupyterLab in a real (headless) Chromium.

``make test-browser`` runs this. It starts JupyterLab exactly as ``make course`` does
(``tools/course.py``: a free port, a token) on a temporary copy of ``notebooks/`` (running
cells from the UI saves outputs; the committed notebooks stay output-free), opens notebook 00
and notebook 03b, runs all cells from the Run menu, waits for the kernel to finish, and checks
that no cell shows an error, that the ``%%ranks`` cell of notebook 00 shows one value per
rank, and that notebook 03b's memory calculator is drawn (controls and figure) and redraws
with a different figure and text when a control changes. Screenshots go to build/browser/.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "browser"
sys.path.insert(0, str(ROOT / "tools"))
import course  # noqa: E402  tools/ is not a package: the launcher of `make course`

RUN_TIMEOUT_S = 600               # one notebook's Run All (each runs in ~2 min on 2 cores)
pytestmark = pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)
STATE_JS = """(panel) => {
    const root = document.querySelector(panel);
    const prompts = root ? [...root.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
        .map(e => e.textContent.trim()) : [];
    const failed = root ? [...root.querySelectorAll('.jp-OutputArea-output')]
        .some(o => o.textContent.includes('Traceback (most recent call last)')) : false;
    const indicator = root && root.querySelector('.jp-Notebook-ExecutionIndicator');
    const ran = prompts.filter(t => /^\\[\\d+\\]:$/.test(t)).length;
    return {cells: prompts.length, ran: ran, running: prompts.filter(t => t === '[*]:').length,
            failed: failed, all_ran: prompts.length > 0 && ran === prompts.length,
            idle: !!indicator && indicator.getAttribute('data-status') === 'idle'};
}"""
SETTINGS = {                      # the test's own JupyterLab settings (not the user's)
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
        {"windowingMode": "none"},                                   # every cell in the DOM
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},            # no news toast
}
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on a copy of the course; yields (base URL, token, notebooks folder)."""
    work = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "notebooks", work / "notebooks")
    for name in ("solutions", "exercises", "tests"):        # what notebooks reach with ../
        (work / name).symlink_to(ROOT / name)
    for rel, values in SETTINGS.items():
        (work / "settings" / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / "settings" / rel).write_text(json.dumps(values))
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # as a student
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in [*SHOTS.glob("0*.png"), *SHOTS.glob("FAILED_*.png")]:
        old.unlink()                  # no screenshot of an earlier run (the book's stays)
    log = open(SHOTS / "jupyterlab.log", "w")  # noqa: SIM115  closed below
    proc, url = course.start(work / "notebooks", open_browser=False, env=env, stdout=log,
                             stderr=subprocess.STDOUT,
                             extra=(f"--LabApp.user_settings_dir={work / 'settings'}",
                                    f"--LabApp.workspaces_dir={work / 'workspaces'}"))
    base, token = url.split("/lab?token=")
    yield base, token, work / "notebooks"
    course.stop(proc)
    log.close()


@pytest.fixture(scope="module")
def page(chromium, lab):
    from playwright.sync_api import sync_playwright  # noqa: PLC0415  optional dependency

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        yield page
        browser.close()


def dismiss_dialog(page) -> None:
    """Accept a dialog JupyterLab puts up while a notebook opens ("Select Kernel")."""
    accept = page.locator(".jp-Dialog .jp-mod-accept")
    if accept.count():
        accept.first.click()


def open_and_run_all(page, lab, name: str) -> float:
    """Open a notebook, run all its cells from the Run menu, wait until done; return seconds."""
    base, token, _ = lab
    page.goto(f"{base}/lab/tree/{name}?token={token}")
    page.wait_for_selector(f"{PANEL} .jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=120_000)
    page.wait_for_selector(f"{PANEL} .jp-CodeCell", timeout=60_000)
    state = {"ran": 0, "running": 0}
    for attempt in range(4):       # JupyterLab may still be connecting the kernel: retry
        page.wait_for_timeout(3000)
        dismiss_dialog(page)
        try:
            page.get_by_role("menuitem", name="Run", exact=True).click(timeout=10_000)
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click(timeout=10_000)
        except Exception as exc:  # noqa: BLE001  a dialog came up in between: try again
            print(f"  {name}: could not click Run > Run All Cells ({type(exc).__name__})")
            page.keyboard.press("Escape")
            continue
        start = time.monotonic()
        while time.monotonic() - start < 30 and not (state["ran"] or state["running"]):
            dismiss_dialog(page)
            time.sleep(0.5)
            state = page.evaluate(STATE_JS, PANEL)
        if state["ran"] or state["running"]:
            break
        print(f"  {name}: Run All Cells started nothing within 30 s (attempt {attempt + 1})")
    else:
        page.screenshot(path=str(SHOTS / f"FAILED_{name}.png"))
        raise RuntimeError(f"{name}: Run > Run All Cells never started the notebook")
    # done: every code cell has an execution count, or a cell failed (Run All stops there)
    last_report = start
    while True:
        state = page.evaluate(STATE_JS, PANEL)
        if state["idle"] and state["running"] == 0 and (state["failed"] or state["all_ran"]):
            break
        now = time.monotonic()
        if now - start > RUN_TIMEOUT_S:
            page.screenshot(path=str(SHOTS / f"FAILED_{name}.png"))
            raise TimeoutError(f"{name}: Run All not done after {RUN_TIMEOUT_S} s: {state}")
        if now - last_report > 30:
            last_report = now
            print(f"  {name}: {now - start:.0f} s, {state['ran']}/{state['cells']} cells ran",
                  flush=True)
        time.sleep(1)
    return time.monotonic() - start


def errors_shown(page) -> list[str]:
    """The text of every error output on screen (tracebacks; warnings on stderr are not)."""
    return page.evaluate("""(panel) => [...document.querySelectorAll(
        panel + ' .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
        .map(o => o.textContent).filter(t => t.includes('Traceback (most recent call last)'))
        .map(t => t.slice(0, 2000))""", PANEL)


def save_and_read(page, lab, name: str):
    """Save the notebook from the UI, then read what the browser saved (the temp copy)."""
    path = lab[2] / name
    before = path.stat().st_mtime
    page.locator(f"{PANEL} .jp-Notebook").click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while path.stat().st_mtime == before and time.monotonic() < deadline:
        time.sleep(0.5)
    return nbformat.read(path, as_version=4)


IMAGE_BYTES_JS = """async (img) => {
    const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
    let text = '';
    for (let i = 0; i < bytes.length; i += 1) text += String.fromCharCode(bytes[i]);
    return btoa(text);
}"""


def image_bytes(image) -> bytes:
    """The PNG the browser shows in an <img> (what the kernel sent), fetched from its src."""
    return base64.b64decode(image.evaluate(IMAGE_BYTES_JS))


def check_saved(nb) -> None:
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(code)
              for o in c.outputs if o.output_type == "error"]
    assert not errors, f"cells with an error output: {errors}"
    assert all(c.execution_count for c in code), "some code cells did not run"


def test_notebook_00_runs_in_the_browser_with_a_rank_cell(page, lab):
    seconds = open_and_run_all(page, lab, "00_welcome.ipynb")
    print(f"notebook 00: Run All Cells took {seconds:.0f} s in the browser")
    page.screenshot(path=str(SHOTS / "00_welcome_after_run_all.png"))
    assert errors_shown(page) == []
    ranks = page.locator(f"{PANEL} .jp-CodeCell", has_text="%%ranks 4 --in base --out total")
    ranks.scroll_into_view_if_needed()
    ranks.screenshot(path=str(SHOTS / "00_ranks_cell.png"))
    # the %%ranks cell brings `total` back, one per rank; the cell after it prints it
    cell = page.locator(f"{PANEL} .jp-CodeCell", has_text='print("total on each rank:", total)')
    shown = cell.locator(".jp-OutputArea-output").all_inner_texts()
    assert any("[10.0, 10.0, 10.0, 10.0]" in t for t in shown), shown
    check_saved(save_and_read(page, lab, "00_welcome.ipynb"))


def test_notebook_03b_memory_calculator_draws_and_redraws(page, lab):
    seconds = open_and_run_all(page, lab, "03b_zero_and_fsdp.ipynb")
    print(f"notebook 03b: Run All Cells took {seconds:.0f} s in the browser")
    assert errors_shown(page) == []
    panel = page.locator(f"{PANEL} .lecture-explorer").first
    panel.scroll_into_view_if_needed()
    image, text = panel.locator("img"), panel.locator(".widget-html")
    assert panel.locator("select").count() >= 4 and panel.locator("input").count() >= 5
    assert image.is_visible() and image.bounding_box()["height"] > 100
    before_text, before_png = text.inner_text(), image_bytes(image)
    before_src = image.get_attribute("src")
    panel.screenshot(path=str(SHOTS / "03_calculator_before.png"))

    dp = panel.locator(".widget-inline-hbox", has=page.locator("label", has_text="dp")
                       ).locator("input").first
    dp.fill("4" if dp.input_value() != "4" else "8")    # another dp than the notebook's
    dp.press("Enter")
    page.wait_for_function("([el, old]) => el.innerText !== old",
                           arg=[text.element_handle(), before_text], timeout=30_000)
    page.wait_for_function("([el, old]) => el.src !== old && el.complete",   # a new picture
                           arg=[image.element_handle(), before_src], timeout=30_000)
    page.wait_for_timeout(500)                         # let it paint before the screenshot
    after_text, after_png = text.inner_text(), image_bytes(image)
    panel.screenshot(path=str(SHOTS / "03_calculator_after.png"))
    print(f"calculator text before: {before_text!r}\n                 after: {after_text!r}")
    assert "dp=64" not in after_text and after_text != before_text
    assert before_png.startswith(b"\x89PNG") and after_png.startswith(b"\x89PNG")
    assert after_png != before_png, "the figure did not change when dp changed"
    assert errors_shown(page) == []
    check_saved(save_and_read(page, lab, "03b_zero_and_fsdp.ipynb"))
