"""The look every page shares: condition colours, other colours, the heatmaps' scale, axis ticks.

Notebooks draw their own Altair charts and take from here only what must match on every page;
:func:`synclib.notebook.setup` applies :data:`CHART_CONFIG` under every chart's own config.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

__all__ = ["CONDITION_COLOURS", "OTHER_COLOURS", "NEGATIVE_GREY", "HEATMAP_SCHEME", "FACET_COLUMNS", "CHART_CONFIG",
           "WRAPPED_LABEL", "colour_scale", "layer_ticks", "point_ticks", "log_ticks", "wrap_title"]

#: one colour per condition on every page
CONDITION_COLOURS = {"genuine": "#4c78a8", "passive": "#f58518", "passive_own": "#ff9da6",
                     "shuffled": "#54a24b", "pseudo": "#b279a2",
                     "lag1": "#e45756", "lag2": "#72b7b2", "surrogates": "#9d755d"}
#: colours for anything else a chart colours: none of the conditions' hues (orange is always passive)
OTHER_COLOURS = ("#6b6b6b", "#bcbd22", "#e377c2", "#8c8c8c", "#17becf", "#eeca3b", "#843c39", "#393b79")
#: a heatmap cell below 0 (worse than predicting the mean)
NEGATIVE_GREY = "#c8c8c8"
#: the heatmaps' colour scheme (test R², CKA), from 0 up
HEATMAP_SCHEME = "viridis"
#: faceted charts put this many panels in a row (two fit the book's text column, legend below)
FACET_COLUMNS = 2
#: axis labels at least 4 px apart (by default Vega lets "600700" read as one number; tests/test_book.py needs 2)
CHART_CONFIG = {"axis": {"labelSeparation": 4},
                "axisPoint": {"labelOverlap": "parity"},
                "axisQuantitative": {"labelOverlap": True}}
#: a category label broken at spaces and underscores, so narrow panels side by side never overlap labels
WRAPPED_LABEL = "split(replace(datum.label, regexp('_', 'g'), ' '), ' ')"


def colour_scale(values, order=None) -> alt.Scale:
    """Colour scale for ``values``: conditions in :data:`CONDITION_COLOURS`; else :data:`OTHER_COLOURS` by each
    value's position in ``order`` where given (``res.run_names``: a pair is named as its first ordered run, so a run
    or a pair has one colour on every page), or in the order the values first appear."""
    present = [v for v in dict.fromkeys(values) if isinstance(v, str)]
    if present and all(v in CONDITION_COLOURS for v in present):
        return alt.Scale(domain=present, range=[CONDITION_COLOURS[v] for v in present])
    order = present if order is None else list(order)
    if present and all(v in order for v in present):
        return alt.Scale(domain=present, range=[OTHER_COLOURS[order.index(v) % len(OTHER_COLOURS)] for v in present])
    return alt.Scale(range=list(OTHER_COLOURS))


def layer_ticks(layers, most: int = 8) -> list[int]:
    """Ticks of a layer axis: every layer up to ``most``, else every few with the first and the last
    (31 layers: 0, 4, ..., 24, 30; the last replaces a regular tick less than a step before it)."""
    vals = sorted({int(v) for v in layers})
    step = max(1, -(-len(vals) // most))
    idx = list(range(0, len(vals), step))
    if idx[-1] != len(vals) - 1:
        if len(idx) > 1 and len(vals) - 1 - idx[-1] < step:
            idx[-1] = len(vals) - 1
        else:
            idx.append(len(vals) - 1)
    return [vals[i] for i in idx]


def point_ticks(values, width: int, label_px: int = 30):
    """Ticks of an ordinal axis ``width`` pixels wide: every value while each gets ``label_px``, else as
    :func:`layer_ticks`; ``alt.Undefined`` (all) for non-integer values."""
    vals = pd.Series(values).dropna().unique()
    most = max(2, width // label_px)
    integers = all(isinstance(v, (int, float, np.number)) and float(v).is_integer() for v in vals)
    if len(vals) <= most or not integers:
        return alt.Undefined
    return layer_ticks(pd.Series(vals), most=most)


def log_ticks(values) -> list[float]:
    """Ticks of a log axis over ``values``: 1, 2 and 5 times the powers of ten (only the powers over more
    than three decades), from the power below the smallest value to the one above the largest."""
    v = pd.to_numeric(pd.Series(values), errors="coerce")
    v = v[np.isfinite(v) & (v > 0)]
    if v.empty:
        return alt.Undefined
    lo, hi = int(np.floor(np.log10(v.min()))), int(np.ceil(np.log10(v.max())))
    steps = (1,) if hi - lo > 3 else (1, 2, 5)
    return [float(m * 10.0 ** e) if e < 0 else m * 10 ** e for e in range(lo, hi + 1) for m in steps
            if m * 10.0 ** e <= 10.0 ** hi]


def wrap_title(text: str, width: int, font_size: int = 12) -> list[str]:
    """``text`` broken at spaces into lines that fit ``width`` pixels (a character taken as 0.6 of the
    font size), so that a title never widens its chart; a word longer than a line stays whole."""
    most = max(8, int(width / (0.6 * font_size)))
    lines: list[str] = []
    for word in str(text).split():
        if lines and len(lines[-1]) + 1 + len(word) <= most:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]
