"""How every figure of a report looks: the matplotlib Agg backend outside notebooks (no display needed), the
colour-blind-safe Okabe-Ito palette (:data:`PALETTE`), markers that tell lines apart without colour, legends
outside the data, and :func:`finish`: the caption under the panels, long titles wrapped, and every axis whose
drawn values are positive and span more than two decades on a log scale, so one large line (sets that remove the
attention sinks) cannot flatten the others. The figures themselves are their run kinds'
(:mod:`fi_toolkit.report.kinds`).
"""

from __future__ import annotations

import sys
import textwrap

import matplotlib

if "ipykernel" not in sys.modules:  # in a notebook, keep its inline backend so the figures show
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402, F401  (the kinds' figures draw with this pyplot)
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402

# The Okabe-Ito colours (Wong, Nature Methods 8:441, 2011), distinguishable with the common colour-vision
# deficiencies, ordered so that the first few differ most; grey in place of its yellow, which is faint on white.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#7F7F7F"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
DECADES = 100.0  # an axis whose positive values span more than this ratio is drawn on a log scale
# matplotlib legend arguments that put a legend right of its axes, outside the data
LEGEND_OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "frameon": False, "fontsize": 8}


def colors(names) -> dict:
    """A colour of :data:`PALETTE` for each name, in order (repeating past eight names)."""
    names = list(dict.fromkeys(names))
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def legend_outside(ax) -> None:
    """Move ``ax``'s legend to the right of the axes, outside the data (seaborn's ``move_legend``);
    :func:`finish`'s tight layout and ``bbox_inches='tight'`` keep it inside the saved figure."""
    if ax.get_legend() is not None:
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=8, title_fontsize=8)


def _drawn(ax, axis: str) -> np.ndarray:
    """Every data value drawn along ``axis`` ('x' or 'y'): lines (reference lines across the axes too), markers,
    bands and bars."""
    i = 0 if axis == "x" else 1
    across = ax.get_yaxis_transform() if axis == "x" else ax.get_xaxis_transform()  # axhline/axvline: other axis
    values = [line.get_xydata()[:, i] for line in ax.get_lines() if line.get_transform() != across]
    for coll in ax.collections:
        offsets = np.asarray(coll.get_offsets())
        if len(offsets) and coll.get_offset_transform() == ax.transData:
            values.append(offsets[:, i])
        if coll.get_transform() == ax.transData:  # fill_between bands, error bars
            values += [np.asarray(path.vertices)[:, i] for path in coll.get_paths()]
    for patch in ax.patches:  # bars (Rectangle) and spans (axvspan: a Rectangle or, in older matplotlib, a Polygon)
        t = patch.get_data_transform()  # where its coordinates live (data, or data along one axis only)
        if t != ax.transData and t != (ax.get_xaxis_transform() if axis == "x" else ax.get_yaxis_transform()):
            continue  # this axis of the patch is in axes coordinates (a span across the axes), not data
        if hasattr(patch, "get_xy") and not hasattr(patch, "get_width"):
            values.append(np.asarray(patch.get_xy(), dtype=float)[:, i])
            continue
        x, y, w, h = patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()
        values.append(np.array([x, x + w] if axis == "x" else [y, y + h], dtype=float))
    v = np.concatenate(values) if values else np.array([])
    return v[np.isfinite(v)]


def log_where_decades(ax) -> None:
    """A log scale on each axis of ``ax`` that autoscales and whose drawn values are never negative and,
    where positive, span more than :data:`DECADES` (zeros then fall off the axis, as a log scale must)."""
    for axis, autoscale, set_scale in (
        ("x", ax.get_autoscalex_on(), ax.set_xscale),
        ("y", ax.get_autoscaley_on(), ax.set_yscale),
    ):
        if not autoscale or getattr(ax, f"get_{axis}scale")() != "linear":
            continue
        v = _drawn(ax, axis)
        positive = v[v > 0]
        if len(positive) > 1 and (v >= 0).all() and positive.max() / positive.min() > DECADES:
            set_scale("log")


def finish(fig, text: str):
    """Lay out ``fig`` with ``text`` (its caption) under the panels: log axes where values span decades
    (:func:`log_where_decades`), a suptitle wider than the figure wrapped."""
    for ax in fig.axes:
        log_where_decades(ax)
    width = int(fig.get_figwidth() * 10)  # characters of an 11-point title that fit the figure, with margins
    if hasattr(fig, "get_suptitle") and len(fig.get_suptitle()) > width:
        fig.suptitle("\n".join(textwrap.wrap(fig.get_suptitle(), width)), fontsize=11)
    fig.text(0.5, 0.005, "\n".join(textwrap.wrap(text, 150)), ha="center", va="bottom", fontsize=7, color="#444")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
