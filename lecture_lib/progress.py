"""Progress of a long experiment: a bar in JupyterLab, plain lines everywhere else.

An experiment that runs for more than a few seconds (a calibration, a sweep
over bucket sizes or schedules) should say how far it has got while it runs,
as ``tqdm`` does. ``progress(items, "what")`` wraps the loop::

    for config in progress(CONFIGS, "train each (dp, tp, pp)"):
        ...

How it is shown depends on where the code runs:

* ``"bar"``: in a Jupyter kernel that a person is looking at (JupyterLab), an
  ipywidgets progress bar with a label (step, elapsed, estimated time left);
  ipywidgets is already a dependency of the pack, so no tqdm is needed;
* ``"lines"``: in a script, under pytest/nbval, in ``make render``: one plain
  line per step (at most about one a second, and always the last), which a log
  and a rendered notebook can show;
* ``"off"``: nothing.

The choice is automatic (:func:`mode`); ``LECTURE_LIB_PROGRESS=bar|lines|off``
overrides it, and so does the ``show=`` argument.
"""
from __future__ import annotations

import os
import sys
import time

MODES = ("bar", "lines", "off")
ENV = "LECTURE_LIB_PROGRESS"
LINE_INTERVAL = 1.0          # seconds between two plain lines (the first and last always show)


def mode() -> str:
    """``"bar"`` in an interactive Jupyter kernel, ``"lines"`` elsewhere, unless ``$ENV`` says."""
    chosen = os.environ.get(ENV, "").strip().lower()
    if chosen:
        if chosen not in MODES:
            raise ValueError(f"{ENV} must be one of {MODES}, not {chosen!r}")
        return chosen
    if "PYTEST_CURRENT_TEST" in os.environ:      # pytest, and the kernels nbval starts from it
        return "lines"
    shell = sys.modules.get("IPython")
    shell = shell.get_ipython() if shell is not None else None
    if shell is not None and type(shell).__name__ == "ZMQInteractiveShell":
        return "bar"
    return "lines"


def _fmt(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def describe(desc: str, done: int, total: int | None, elapsed: float) -> str:
    """The text of one step: ``desc: 3/9 after 12 s, about 24 s left``."""
    head = f"{desc}: {done}/{total}" if total else f"{desc}: {done}"
    text = f"{head} after {_fmt(elapsed)}"
    if total and 0 < done < total:
        text += f", about {_fmt(elapsed / done * (total - done))} left"
    return text


class _Lines:
    def __init__(self, desc: str, total: int | None):
        self.desc, self.total, self.last = desc, total, time.monotonic()
        print(describe(desc, 0, total, 0.0), flush=True)       # it has started

    def show(self, done: int, elapsed: float, final: bool = False) -> None:
        now = time.monotonic()
        if final or now - self.last >= LINE_INTERVAL:
            self.last = now
            print(describe(self.desc, done, self.total, elapsed), flush=True)


class _Bar:
    def __init__(self, desc: str, total: int | None):
        import ipywidgets as w  # noqa: PLC0415  only a kernel with a front end needs the widget
        from IPython.display import display  # noqa: PLC0415  (same)

        self.desc, self.total = desc, total
        self.bar = w.IntProgress(value=0, min=0, max=total or 1, bar_style="info")
        self.label = w.Label(describe(desc, 0, total, 0.0))
        display(w.HBox([self.bar, self.label]))

    def show(self, done: int, elapsed: float, final: bool = False) -> None:
        self.bar.value = min(done, self.bar.max) if self.total else int(final)
        self.label.value = describe(self.desc, done, self.total, elapsed)
        if final:
            self.bar.bar_style = "success"


def progress(items, desc: str = "progress", total: int | None = None, show: str | None = None):
    """Yield ``items`` one by one, showing how many are done (see the module docstring)."""
    show = show or mode()
    if show not in MODES:
        raise ValueError(f"show must be one of {MODES}, not {show!r}")
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    if show == "off":
        yield from items
        return
    view = _Bar(desc, total) if show == "bar" else _Lines(desc, total)
    start, done = time.monotonic(), 0
    for item in items:
        yield item
        done += 1
        view.show(done, time.monotonic() - start, final=done == total)
    if done != total:                       # an iterable without a length, or one cut short
        view.show(done, time.monotonic() - start, final=True)
