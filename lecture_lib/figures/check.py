"""Checks a finished matplotlib figure for what makes a plot hard to read (issue 17).

:func:`problems` lists, in words, every text smaller than ``min_font`` points and every
legend that covers data: a legend box that contains a plotted point of a line, a marker of
a scatter, or overlaps a bar or span of the same axes. :func:`check_figure` raises with that
list, so a notebook's plot cell asserts its own figure is legible (``check_figure(fig)``
after drawing). Legends placed outside the axes (``bbox_to_anchor``, ``fig.legend``) are
checked against every axes of the figure.
"""
from __future__ import annotations

import numpy as np
from matplotlib.collections import Collection, PathCollection
from matplotlib.legend import Legend
from matplotlib.patches import Rectangle
from matplotlib.text import Text

MIN_FONT = 8.0


def _texts(fig) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def _data_boxes(ax, renderer) -> list[np.ndarray]:
    """Display-space points (n x 2) or boxes (x0, y0, x1, y1) of the data an axes draws."""
    items = []
    for line in ax.get_lines():
        if line.get_visible() and len(line.get_xdata()):
            xy = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)
            items.append(("points", _densify(line.get_transform().transform(xy),
                                             line.get_linestyle() not in ("None", ""))))
    for coll in ax.collections:
        if not (isinstance(coll, Collection) and coll.get_visible()):
            continue
        if isinstance(coll, PathCollection):           # scatter: one marker per offset
            items.append(("points", coll.get_offset_transform().transform(coll.get_offsets())))
            continue
        for path in coll.get_paths():                  # bars, spans, fills: their boxes
            ext = path.get_extents(coll.get_transform())
            items.append(("box", np.array([ext.x0, ext.y0, ext.x1, ext.y1])))
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_visible() and patch.get_width():
            ext = patch.get_window_extent(renderer)
            items.append(("box", np.array([ext.x0, ext.y0, ext.x1, ext.y1])))
    return items


def _densify(pts: np.ndarray, joined: bool, per_segment: int = 32) -> np.ndarray:
    """The points of a drawn line: its vertices and, when joined, points along each segment."""
    if not joined or len(pts) < 2:
        return pts
    t = np.linspace(0.0, 1.0, per_segment, endpoint=False)[None, :, None]
    seg = pts[:-1, None, :] + t * (pts[1:, None, :] - pts[:-1, None, :])
    return np.concatenate([seg.reshape(-1, 2), pts[-1:]])


def _covers(box, kind, data) -> bool:
    x0, y0, x1, y1 = box.x0, box.y0, box.x1, box.y1
    if kind == "points":
        pts = data[np.isfinite(data).all(axis=1)]
        return bool(((pts[:, 0] > x0) & (pts[:, 0] < x1) & (pts[:, 1] > y0)
                     & (pts[:, 1] < y1)).any())
    bx0, by0, bx1, by1 = data
    return bx0 < x1 and bx1 > x0 and by0 < y1 and by1 > y0


def problems(fig, min_font: float = MIN_FONT) -> list[str]:
    """What makes `fig` hard to read: small fonts and legends over data, in words."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = [f"text {t.get_text()[:30]!r} is {t.get_fontsize():.1f} pt (< {min_font} pt)"
             for t in _texts(fig) if t.get_fontsize() < min_font]
    legends = [leg for leg in fig.findobj(Legend) if leg.get_visible()]
    for leg in legends:
        box = leg.get_window_extent(renderer)
        for ax in fig.axes:
            for kind, data in _data_boxes(ax, renderer):
                if _covers(box, kind, data):
                    title = ax.get_title() or f"axes {fig.axes.index(ax)}"
                    found.append(f"the legend covers data of {title!r}")
                    break
    return found


def check_figure(fig, min_font: float = MIN_FONT) -> None:
    """Raise AssertionError naming each problem :func:`problems` finds in `fig`."""
    found = problems(fig, min_font)
    assert not found, "figure hard to read: " + "; ".join(found)


__all__ = ["MIN_FONT", "check_figure", "problems"]
