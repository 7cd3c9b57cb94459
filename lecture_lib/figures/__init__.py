"""Everything the course draws, in one package: the top layer of the library.

* :mod:`.plots`: the course's look (``use_style``, one colour per kind of work in
  ``COLORS``), the label that says who measured a figure and in which time
  (``machine_label``, ``stamp``), and the Gantt chart of per-rank spans (``plot_timeline``);
* :mod:`.check`: the legibility check every figure passes (no small fonts, no legend
  over the data);
* :mod:`.pictures`: the conceptual pictures, one idea per module, each drawn once from the
  library's own objects (which rank holds which shard, the ring's steps, ...);
* :mod:`.widgets`: the ipywidgets explorers (memory calculator, schedule explorer, planner).

Drawing imports the algorithms, never the other way round: no algorithm package imports
this one, so building a model or an optimizer never loads matplotlib. Import from the
submodules (``from lecture_lib.figures import plots``); this file imports nothing.
"""
