"""ipywidgets explorers for the notebooks, one submodule per lecture topic.

Each explorer is a function that returns a widget (so a notebook cell ends
with it); the computation behind it lives in the library module it explores,
and the figures use :mod:`lecture_lib.plots`.
"""
