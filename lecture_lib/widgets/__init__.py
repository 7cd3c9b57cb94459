"""ipywidgets explorers for the notebooks, one submodule per lecture topic.

Each explorer is a function that returns a widget (so a notebook cell ends
with it); the computation behind it lives in the library module it explores,
and the figures use :mod:`lecture_lib.plots`.
"""


def explorer(controls: dict, render, rows=None):
    """A panel that redraws whenever a control changes: the pattern every explorer shares.

    ``render(**values)`` gets the controls' values and returns ``(figure, state)``;
    a ``"text"`` entry of ``state`` is printed above the figure. A ValueError
    (a configuration that is not valid) is shown as text instead. The panel
    exposes ``.controls``, ``.update()`` and ``.state``, the last state with an
    ``"error"`` entry (None, or the message), so notebooks and tests can assert
    on what is shown.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    out = w.Output()
    state: dict = {"error": None}

    def update(*_):
        out.clear_output(wait=True)
        with out:
            try:
                fig, result = render(**{k: c.value for k, c in controls.items()})
            except ValueError as exc:
                state.update({k: None for k in state}, error=str(exc))
                print(exc)
                return
            state.update(result, error=None)
            if state.get("text"):
                print(state["text"])
            display(fig)
            plt.close(fig)

    for control in controls.values():
        control.observe(update, names="value")
    update()
    panel = w.VBox([*(rows or [w.HBox(list(controls.values()))]), out])
    panel.controls, panel.update, panel.state = controls, update, state
    return panel
