"""ipywidgets explorers for the notebooks, one submodule per lecture topic.

Each explorer is a function that returns a widget (so a notebook cell ends
with it); the computation behind it lives in the library module it explores,
and the figures use :mod:`lecture_lib.figures.plots`.

The figure is drawn into an ``ipywidgets.Image`` (PNG bytes) and the text into
an ``HTML`` widget, not into an ``Output`` widget. Two reasons:

* the picture is then part of the widget's state, so a rendered notebook
  (``make render`` stores the widget state) shows it instead of a blank box;
* an ``Output`` widget that captures output makes nbclient (nbconvert,
  ``make render``) send a ``comm_msg`` on the kernel's shell channel while it
  is also waiting on that channel for the cell's ``execute_reply``; that
  reply was sometimes never seen, and the cell sat idle until the cell timeout
  (notebook 07's planner cell: ~14 minutes once; reproduced here, 1 run in 4).
"""
from __future__ import annotations

import base64
import html
import io

import ipywidgets as w
import matplotlib.pyplot as plt


def figure_png(fig) -> bytes:
    """The figure as PNG bytes (what the inline backend would show); the figure is closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.dpi, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _pre(text: str) -> str:
    return f"<pre style='margin:0; font-size:12px'>{html.escape(text)}</pre>" if text else ""


class Explorer(w.VBox):
    """An explorer's panel. Displayed, it offers its current figure and text as a static
    snapshot beside the live widget: JupyterLab shows the widget, and a page rendered
    without a widget manager (the web book) shows the snapshot."""

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        *_, text, image = self.children
        if image.value and image.layout.display != "none":
            bundle["image/png"] = base64.b64encode(image.value).decode()
        if text.value:
            bundle["text/html"] = text.value
        return bundle


def explorer(controls: dict, render, rows=None):
    """A panel that redraws whenever a control changes: the pattern every explorer shares.

    ``render(**values)`` gets the controls' values and returns ``(figure, state)``;
    a ``"text"`` entry of ``state`` is shown above the figure. A ValueError
    (a configuration that is not valid) is shown as text instead, and the
    figure is hidden. The panel exposes ``.controls``, ``.update()``, ``.image``
    (the figure's widget), ``.text`` and ``.state``, the last state with an
    ``"error"`` entry (None, or the message), so notebooks and tests can assert
    on what is shown.
    """
    text = w.HTML()
    image = w.Image(format="png")
    state: dict = {"error": None}

    def update(*_):
        try:
            fig, result = render(**{k: c.value for k, c in controls.items()})
        except ValueError as exc:
            state.update({k: None for k in state}, error=str(exc))
            text.value = _pre(str(exc))
            image.layout.display = "none"
            return
        png = figure_png(fig)                  # draw first: text and figure change together
        state.update(result, error=None)
        text.value = _pre(state.get("text") or "")
        image.value = png
        image.layout.display = None

    for control in controls.values():
        control.observe(update, names="value")
    update()
    panel = Explorer([*(rows or [w.HBox(list(controls.values()))]), text, image])
    panel.add_class("lecture-explorer")
    panel.controls, panel.update, panel.state = controls, update, state
    panel.image, panel.text = image, text
    return panel
