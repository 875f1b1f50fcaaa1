"""Altair charts for the notebooks, and an offline renderer for them.

Every chart function takes a tidy :class:`pandas.DataFrame` (built by
:mod:`synclib.analysis.results`) and returns an altair chart with tooltips.  Nothing here computes
results; it only draws.

Offline rendering
-----------------
``enable()`` registers and turns on the ``synclib`` altair renderer.  A chart displayed in
a notebook then carries

* ``application/vnd.vegalite.v6+json``: the spec (JupyterLab draws it natively),
* ``text/html``: a ``<div class="synclib-vega">`` holding a PNG of the chart and a script
  that calls ``vegaEmbed`` on it.  The book serves ``vega``, ``vega-lite`` and
  ``vega-embed`` from ``book/_static/vendor`` (see ``_config.yml``), so the interactive
  chart replaces the PNG without any network access; readers without JavaScript (or a
  notebook viewer without the libraries) keep the PNG,
* ``image/png``: the same PNG, for PDF builds and plain viewers.

No CDN URL is ever written into the output.

Every spec gets :data:`CHART_CONFIG` (axis labels kept apart, see there) where it sets nothing
itself.  A :func:`placeholder` shown on its own (nothing to draw) becomes a sentence, not an
empty chart.  ``enable()`` also shows every pandas DataFrame with one header row
(:func:`flat_table`).
"""
from __future__ import annotations

import base64
import html
import json
import math
import uuid

import altair as alt
import numpy as np
import pandas as pd

RENDERER = "synclib"
VEGALITE_MIME = f"application/vnd.vegalite.v{alt.SCHEMA_VERSION.lstrip('v').split('.')[0]}+json"
NEGATIVE_GREY = "#c8c8c8"
#: one colour per condition on every page (:func:`colour_scale`)
CONDITION_COLOURS = {"genuine": "#4c78a8", "passive": "#f58518", "shuffled": "#54a24b", "pseudo": "#b279a2",
                     "lag1": "#e45756", "lag2": "#72b7b2", "surrogates": "#9d755d"}
#: the colours of whatever else a chart colours (ordered runs, pairs, families, settings): none of
#: the conditions' hues, so that no colour reads as a condition it is not (orange is always passive)
OTHER_COLOURS = ("#6b6b6b", "#bcbd22", "#e377c2", "#8c8c8c", "#17becf", "#eeca3b", "#843c39", "#393b79")


def colour_scale(values):
    """The colour scale of a chart whose colour encodes ``values``: where they are conditions
    (:data:`CONDITION_COLOURS`), each its own colour, the same on every page, in the order they come;
    otherwise :data:`OTHER_COLOURS`."""
    present = [v for v in dict.fromkeys(values) if isinstance(v, str)]
    if present and all(v in CONDITION_COLOURS for v in present):
        return alt.Scale(domain=present, range=[CONDITION_COLOURS[v] for v in present])
    return alt.Scale(range=list(OTHER_COLOURS))
HEATMAP_SCHEME = "viridis"
#: faceted charts put this many panels in a row (with the legend below, two fit the book's text column)
FACET_COLUMNS = 2
PNG_SCALE = 1.0
EMBED_OPTIONS = {"renderer": "svg", "actions": {"export": True, "source": False,
                                                "compiled": False, "editor": False}}
#: config every chart gets (where its spec sets none): axis labels at least 4 pixels apart.  Vega
#: hides labels that would overlap (quantitative axes: every other one; log axes: greedily), but
#: by default it lets labels touch, and its text measure is a pixel off the browser's, so "600700"
#: and "-0.3-0.2" read as one number; ordinal point axes (figure 7's k = 1..30) drop every other
#: label until they fit.  tests/test_book.py fails on labels less than 2 pixels apart.
CHART_CONFIG = {"axis": {"labelSeparation": 4},
                "axisPoint": {"labelOverlap": "parity"},
                "axisQuantitative": {"labelOverlap": True}}
#: the ``name`` of a :func:`placeholder` chart: shown on its own it renders as a sentence
PLACEHOLDER_NAME = "synclib-placeholder"


# --------------------------------------------------------------------------- rendering
def chart_png(spec: dict, scale: float = PNG_SCALE) -> bytes:
    """A PNG of a Vega-Lite spec, drawn by vl-convert (no browser, no network)."""
    import vl_convert as vlc

    version = alt.SCHEMA_VERSION.lstrip("v").rsplit(".", 1)[0]
    return vlc.vegalite_to_png(spec, vl_version=version, scale=scale)


def chart_html(spec: dict, png: bytes | None = None, div_id: str | None = None) -> str:
    """The ``text/html`` output: a div with the PNG fallback, and a ``vegaEmbed`` call.

    The script only uses a ``vegaEmbed`` that the page already has (the book loads it from
    ``_static/vendor``); where there is none, the PNG stays.
    """
    div_id = div_id or f"synclib-vega-{uuid.uuid4().hex[:12]}"
    img = ""
    if png is not None:
        desc = html.escape(str(spec.get("description") or _title_text(spec) or "chart"), quote=True)
        img = (f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" '
               f'alt="{desc}" style="max-width:100%">')
    spec_js = json.dumps(spec).replace("</", "<\\/")
    opts_js = json.dumps(EMBED_OPTIONS)
    return (
        f'<div class="synclib-vega" id="{div_id}">{img}</div>\n'
        "<script type=\"text/javascript\">\n"
        "(function () {\n"
        f"  var el = document.getElementById({json.dumps(div_id)});\n"
        f"  var spec = {spec_js};\n"
        "  function draw() {\n"
        "    if (typeof window.vegaEmbed !== 'function') { return; }\n"
        "    var keep = el.innerHTML;\n"
        f"    window.vegaEmbed(el, spec, {opts_js}).then(function () {{\n"
        "      el.setAttribute('data-rendered', 'true');\n"
        "    }).catch(function (err) {\n"
        "      el.innerHTML = keep; el.setAttribute('data-error', String(err));\n"
        "    });\n"
        "  }\n"
        "  if (document.readyState === 'complete') { draw(); }\n"
        "  else { window.addEventListener('load', draw); }\n"
        "})();\n"
        "</script>"
    )


def _title_text(spec: dict) -> str:
    t = spec.get("title")
    if isinstance(t, dict):
        t = t.get("text")
    if isinstance(t, list):
        t = " ".join(map(str, t))
    return str(t) if t else ""


def with_config(spec: dict) -> dict:
    """``spec`` with :data:`CHART_CONFIG` under what its own ``config`` sets (a copy)."""
    spec = dict(spec)
    config = dict(spec.get("config") or {})
    for key, values in CHART_CONFIG.items():
        config[key] = {**values, **(config.get(key) or {})}
    spec["config"] = config
    return spec


def placeholder_text(spec: dict) -> tuple[str, str] | None:
    """``(title, message)`` when ``spec`` is a :func:`placeholder` alone, else None."""
    if spec.get("name") != PLACEHOLDER_NAME:
        return None
    data = spec.get("data") or {}
    rows = (spec.get("datasets") or {}).get(data.get("name"), data.get("values")) or []
    message = str(rows[0].get("message", "")) if rows else ""
    return _title_text(spec), " ".join(message.split())


def _leaf_fields(spec) -> list[set[str]]:
    """Per drawn mark of a spec (its layers, panels, facets): the fields on a quantitative x or y axis."""
    out: list[set[str]] = []
    if not isinstance(spec, dict):
        return out
    enc = spec.get("encoding") or {}
    fields = {e["field"] for ch in ("x", "y") if isinstance(e := enc.get(ch), dict)
              and e.get("type") == "quantitative" and isinstance(e.get("field"), str)}
    if fields and "mark" in spec:
        out.append(fields)
    for key in ("layer", "vconcat", "hconcat", "concat"):
        for sub in spec.get(key) or ():
            out += _leaf_fields(sub)
    if isinstance(spec.get("spec"), dict):  # a facet's or a repeat's inner chart
        out += _leaf_fields(spec["spec"])
    return out


def nothing_to_draw(spec: dict) -> bool:
    """Whether no mark of ``spec`` has a record with finite values in all the fields it draws on
    quantitative axes (every SyncR² NaN: a run too small to fit the maps), so the chart would be an
    empty frame.  Marks without a quantitative field, or a spec without inline data, are not judged."""
    leaves = _leaf_fields(spec)
    records = [r for rows in (spec.get("datasets") or {}).values() for r in rows if isinstance(r, dict)]
    if not leaves or not records:
        return False

    def finite(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    return not any(all(finite(r.get(f)) for f in fields) for fields in leaves for r in records)


def placeholder_html(title: str, message: str) -> str:
    """A placeholder as the page shows it: one sentence, no chart frame."""
    text = message[:1].upper() + message[1:]
    if text and text[-1] not in ".!?":
        text += "."
    return (f'<p class="synclib-placeholder"><b>{html.escape(title or "Chart")}</b>: not drawn. '
            f"{html.escape(text)}</p>")


def offline_renderer(spec: dict, **metadata) -> dict:
    """Altair renderer: a MIME bundle with the spec, offline HTML and a PNG (see module doc).

    A :func:`placeholder` on its own gives a sentence (``text/html`` and ``text/plain``)
    instead: a chart frame with nothing drawn in it reads as a broken chart."""
    empty = placeholder_text(spec)
    if empty is None and nothing_to_draw(spec):
        empty = (_title_text(spec), "no finite value in this run for this chart (too few samples to fit the maps?)")
    if empty is not None:
        return {"text/html": placeholder_html(*empty),
                "text/plain": f"{empty[0] or 'Chart'}: not drawn. {empty[1]}"}
    spec = with_config(spec)
    png = chart_png(spec) if metadata.get("png", True) else None
    bundle = {
        VEGALITE_MIME: spec,
        "text/html": chart_html(spec, png),
        "text/plain": f"<Vega-Lite chart: {_title_text(spec) or 'untitled'}>",
    }
    if png is not None:
        bundle["image/png"] = base64.b64encode(png).decode()
    return bundle


def enable(png: bool = True) -> None:
    """Register and enable the offline ``synclib`` renderer; lift altair's 5000-row cap; in an
    IPython kernel, show DataFrames through :func:`flat_table` (one header row)."""
    if RENDERER not in alt.renderers.names():
        alt.renderers.register(RENDERER, offline_renderer)
    alt.renderers.enable(RENDERER, png=png)
    alt.data_transformers.disable_max_rows()
    try:
        from IPython import get_ipython
    except ImportError:  # altair without IPython: nothing displays DataFrames
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, flat_table_html)


# --------------------------------------------------------------------------- tables
def flat_table(frame: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """``frame`` as a table with one header row, and whether to show its index.

    pandas writes a second header row for a named index (``label`` under a pivot's
    ``setting``) or a MultiIndex of rows (``run``, ``genuine vs``), and stacks the levels of
    MultiIndex columns: named index levels become ordinary first columns, column levels are
    joined with " / ", the columns' own name is dropped.  An unnamed index stays (pandas
    shows it in the header row's first, empty cell)."""
    out = frame.copy()
    if isinstance(out.columns, pd.MultiIndex):
        out.columns = [" / ".join(str(v) for v in col if str(v) != "") for col in out.columns]
    out.columns.name = None
    if any(n is not None for n in out.index.names):
        out.index.names = [n if n is not None else f"level {i}" for i, n in enumerate(out.index.names)]
        return out.reset_index(), False
    return out, True


def flat_table_html(frame: pd.DataFrame) -> str:
    """The ``text/html`` of a DataFrame in a page: pandas' own, of :func:`flat_table` (of
    ``frame`` itself where an index level's name is also a column's)."""
    try:
        flat, index = flat_table(frame)
    except ValueError:  # reset_index: "cannot insert NAME, already exists"
        return frame._repr_html_()
    if index:
        return flat._repr_html_()
    return flat.to_html(index=False, notebook=True, max_rows=pd.get_option("display.max_rows"),
                        max_cols=pd.get_option("display.max_columns"))


# --------------------------------------------------------------------------- helpers
#: a category axis label broken onto lines at spaces and underscores ("romantic_relationship",
#: "partner previous"): narrow panels side by side never overlap their labels
WRAPPED_LABEL = "split(replace(datum.label, regexp('_', 'g'), ' '), ' ')"


def placeholder(title: str, message: str) -> alt.Chart:
    """A chart that only says why there is nothing to draw (e.g. an analysis not run),
    the message wrapped to the chart's width."""
    import textwrap

    lines = textwrap.wrap(message, 64) or [""]
    return alt.Chart(pd.DataFrame({"message": ["\n".join(lines)]})).mark_text(
        align="left", baseline="top", fontSize=13, color="#555", lineBreak="\n", x=0, y=0).encode(
        text="message:N").properties(title=alt.TitleParams(wrap_title(title, 460, 13)), width=460,
                                     height=18 * len(lines), name=PLACEHOLDER_NAME)


def is_placeholder(chart) -> bool:
    """Whether ``chart`` is a :func:`placeholder` (shown alone, a sentence: :func:`offline_renderer`)."""
    return getattr(chart, "name", None) == PLACEHOLDER_NAME


def placeholder_if_empty(func):
    """Decorator: an empty ``frame`` (first argument) gives a :func:`placeholder` chart."""
    import functools

    @functools.wraps(func)
    def wrapper(frame, *args, **kw):
        if isinstance(frame, pd.DataFrame) and frame.empty:
            title = kw.get("title", args[0] if args and isinstance(args[0], str) else "")
            return placeholder(title, "no data in this run for this chart")
        return func(frame, *args, **kw)

    return wrapper


def with_bounds(frame: pd.DataFrame, mean: str = "mean", se: str = "se") -> pd.DataFrame:
    out = frame.copy()
    s = out[se].fillna(0.0) if se in out else 0.0
    out["lo"] = out[mean] - s
    out["hi"] = out[mean] + s
    return out


def need_columns(frame: pd.DataFrame, cols, what: str) -> None:
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise KeyError(f"{what}: frame lacks column(s) {missing}; has {list(frame.columns)}")


# --------------------------------------------------------------------------- figure 2, 3
@placeholder_if_empty
def r2_heatmap(frame: pd.DataFrame, title: str, src_title: str = "source layer",
               tgt_title: str = "target layer", vmax: float | None = None,
               size: int = 220, value: str = "r2", value_title: str = "test R²") -> alt.LayerChart:
    """Test R² per layer pair; negative cells grey; each source layer's best target boxed.

    Parameters
    ----------
    frame : DataFrame
        Columns ``src_layer, tgt_layer, r2, best`` (``best``: the maximum over targets for
        that source layer); rows with NaN ``r2`` (padding) are dropped.
    vmax : float, optional
        Upper end of the colour scale (share it across panels); default the frame's max.
    value, value_title : the column drawn instead of ``r2`` (e.g. ``cka``) and its legend title
    """
    need_columns(frame, ["src_layer", "tgt_layer", value, "best"], "r2_heatmap")
    d = frame.dropna(subset=[value]).rename(columns={value: "r2"})
    if d.empty:
        return placeholder(title, f"no finite {value_title} in this run for this panel (too few samples?)")
    top = float(vmax if vmax is not None else max(d["r2"].max(), 1e-6))
    base = alt.Chart(d).encode(
        x=alt.X("src_layer:O", title=src_title, axis=alt.Axis(labelAngle=0, values=axis_ticks(d["src_layer"]))),
        y=alt.Y("tgt_layer:O", title=tgt_title, sort="descending", axis=alt.Axis(values=axis_ticks(d["tgt_layer"]))),
        tooltip=[alt.Tooltip("src_layer:O", title="source layer"),
                 alt.Tooltip("tgt_layer:O", title="target layer"),
                 alt.Tooltip("r2:Q", title=value_title, format=".3f")],
    )
    cells = base.mark_rect().encode(
        color=alt.when(alt.datum.r2 >= 0)
        .then(alt.Color("r2:Q", title=value_title,
                        scale=alt.Scale(scheme=HEATMAP_SCHEME, domain=[0, top])))
        .otherwise(alt.value(NEGATIVE_GREY))
    )
    boxes = base.mark_rect(fill=None, stroke="black", strokeWidth=1.5).transform_filter(
        alt.datum.best)
    # a title longer than the panel would widen it: wrapped onto lines of the panel's width
    return alt.layer(cells, boxes).properties(
        title=alt.TitleParams(wrap_title(title, size, 12), fontSize=12), width=size, height=size)


def wrap_title(text: str, width: int, font_size: int = 12) -> list[str]:
    """``text`` broken at spaces into lines that fit ``width`` pixels at ``font_size`` (a
    character taken as 0.6 of the font size, wide for Vega's default sans-serif), so that no
    title is cut; a single word longer than a line stays whole."""
    most = max(8, int(width / (0.6 * font_size)))
    lines: list[str] = []
    for word in str(text).split():
        if lines and len(lines[-1]) + 1 + len(word) <= most:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def axis_ticks(layers: pd.Series, most: int = 8) -> list[int]:
    """Layer ticks: every layer up to ``most`` layers, else every few, first and last kept.

    The last layer replaces the regular tick before it when the two would sit less than a
    step apart (31 layers: 0, 4, ..., 24, 30, not ..., 24, 28, 30 with 28 and 30 crowded)."""
    vals = sorted({int(v) for v in layers})
    step = max(1, -(-len(vals) // most))
    idx = list(range(0, len(vals), step))
    if idx[-1] != len(vals) - 1:
        if len(idx) > 1 and len(vals) - 1 - idx[-1] < step:
            idx[-1] = len(vals) - 1
        else:
            idx.append(len(vals) - 1)
    return [vals[i] for i in idx]


def point_ticks(values: pd.Series, width: int, label_px: int = 30):
    """Ticks of an ordinal axis of ``width`` pixels: every value while each gets ``label_px``,
    else every few integer values (:func:`axis_ticks`: 1, 5, 9, ..., 25, 30 for k = 1..30);
    ``alt.Undefined`` (all) for values that are not integers."""
    vals = pd.Series(values).dropna().unique()
    most = max(2, width // label_px)
    integers = all(isinstance(v, (int, float, np.number)) and float(v).is_integer() for v in vals)
    if len(vals) <= most or not integers:
        return alt.Undefined
    return axis_ticks(pd.Series(vals), most=most)


def log_ticks(values: pd.Series) -> list[float]:
    """Ticks of a log axis over ``values``: 1, 2 and 5 times the powers of ten (only the
    powers over more than three decades), from the power of ten below the smallest value to
    the one above the largest (Vega's default ticks, 100, 200, ..., 900, crowd at the top)."""
    v = pd.to_numeric(pd.Series(values), errors="coerce")
    v = v[np.isfinite(v) & (v > 0)]
    if v.empty:
        return alt.Undefined
    lo, hi = int(np.floor(np.log10(v.min()))), int(np.ceil(np.log10(v.max())))
    steps = (1,) if hi - lo > 3 else (1, 2, 5)
    return [float(m * 10.0 ** e) if e < 0 else m * 10 ** e for e in range(lo, hi + 1) for m in steps
            if m * 10.0 ** e <= 10.0 ** hi]


def heatmap_grid(frames: dict[str, pd.DataFrame], columns: int = 2, size: int | None = None,
                 vmax: float | None = None, **kw) -> alt.VConcatChart:
    """:func:`r2_heatmap` panels in rows of ``columns`` with one shared colour scale.

    Sized to fit a book's text column (about 650 pixels at a laptop's width): two 210-pixel
    panels per row with their axes and the shared legend, or one 360-pixel panel; layer ticks
    every few layers; hover shows both layers and R².  ``vmax`` fixes the top of the shared
    colour scale (default: the largest R² shown).
    """
    if not frames:
        raise ValueError("heatmap_grid: no panels to draw")
    value = kw.get("value", "r2")
    finite = [f[value].to_numpy(dtype=float) for f in frames.values() if value in f and len(f)]
    finite = [v[np.isfinite(v)] for v in finite]
    if vmax is None:
        vmax = max((float(v.max()) for v in finite if v.size), default=1e-6)
    columns = max(1, min(columns, len(frames)))
    size = size or (210 if columns > 1 else 360)
    panels = [r2_heatmap(f, title=t, vmax=max(vmax, 1e-6), size=size, **kw) for t, f in frames.items()]
    if all(is_placeholder(p) for p in panels):  # no panel has anything to draw: one sentence, no frames
        what = kw.get("value_title", "test R²")
        return placeholder("; ".join(frames), f"no finite {what} in this run for any panel (too few samples?)"
                           if any(len(f) for f in frames.values()) else "no data in this run for this chart")
    rows = [alt.hconcat(*panels[i:i + columns]) for i in range(0, len(panels), columns)]
    return alt.vconcat(*rows).resolve_scale(color="shared")


# --------------------------------------------------------------------------- bars / lines
@placeholder_if_empty
def grouped_bars(frame: pd.DataFrame, x: str, group: str, title: str, y_title: str = "SyncR²",
                 column: str | None = None, x_title: str | None = None,
                 group_title: str | None = None, sort=None, width: int = 220) -> alt.Chart:
    """Bars of ``mean`` by ``x`` and ``group`` with ± standard-error bars.

    Parameters
    ----------
    frame : DataFrame
        Columns ``x``, ``group``, ``mean``, ``se`` (and ``column`` when faceting); extra
        columns show in the tooltip.
    column : facet by ``column``, :data:`FACET_COLUMNS` panels per row, legend below
    """
    need_columns(frame, [x, group, "mean", "se"] + ([column] if column else []), "grouped_bars")
    d = with_bounds(frame)
    extra = [c for c in d.columns if c not in {x, group, "mean", "se", "lo", "hi", column}]
    tips = [alt.Tooltip(f"{x}:N"), alt.Tooltip(f"{group}:N"),
            alt.Tooltip("mean:Q", format=".3f"), alt.Tooltip("se:Q", format=".3f")]
    tips += [alt.Tooltip(f"{c}:N") for c in extra if d[c].dtype == object]
    xs = alt.X(f"{x}:N", title=x_title or x, sort=sort, axis=alt.Axis(labelAngle=0, labelExpr=WRAPPED_LABEL))
    bars = alt.Chart().mark_bar().encode(
        x=xs, xOffset=alt.XOffset(f"{group}:N", sort=None),
        y=alt.Y("mean:Q", title=y_title),
        color=alt.Color(f"{group}:N", title=group_title or group, sort=None, scale=colour_scale(d[group]),
                        legend=alt.Legend(orient="bottom") if column else alt.Undefined), tooltip=tips)
    err = alt.Chart().mark_errorbar(ticks=True).encode(
        x=xs, xOffset=alt.XOffset(f"{group}:N", sort=None),
        y=alt.Y("lo:Q", title=y_title), y2="hi:Q", tooltip=tips)
    layered = alt.layer(bars, err, data=d).properties(width=width)
    if column:
        return layered.facet(facet=alt.Facet(f"{column}:N", title=None, sort=None),
                             columns=FACET_COLUMNS).properties(title=title)
    return layered.properties(title=title)


@placeholder_if_empty
def lines_with_se(frame: pd.DataFrame, x: str, series: str, title: str,
                  y_title: str = "SyncR²", x_title: str | None = None,
                  column: str | None = None, x_type: str = "O", log_x: bool = False,
                  width: int = 260) -> alt.Chart:
    """Lines of ``mean`` against ``x``, one per ``series``, with ± SE bars.

    Parameters
    ----------
    frame : DataFrame
        Columns ``x``, ``series``, ``mean``, ``se`` (and ``column`` when faceting).
    x_type : {"O", "Q"}
        Ordinal (lags) or quantitative (sample sizes) x axis.
    column : facet by ``column``, :data:`FACET_COLUMNS` panels of 220 pixels per row, legend below
    """
    need_columns(frame, [x, series, "mean", "se"] + ([column] if column else []), "lines_with_se")
    d = with_bounds(frame)
    scale = alt.Undefined
    if log_x:  # the data's own range, not the powers of ten around it (10-1,000 for data at 50-194)
        v = pd.to_numeric(d[x], errors="coerce")
        v = v[np.isfinite(v) & (v > 0)]
        scale = (alt.Scale(type="log", domain=[float(v.min()) / 1.15, float(v.max()) * 1.15], nice=False)
                 if len(v) else alt.Scale(type="log"))
    panel = min(width, 220) if column else width
    if x_type == "O":
        axis = alt.Axis(labelAngle=0, values=point_ticks(d[x], panel))
    else:
        ticks = log_ticks(d[x]) if log_x else alt.Undefined
        if log_x and ticks is not alt.Undefined:
            lo, hi = scale.domain
            ticks = [t for t in ticks if lo <= t <= hi] or ticks
        axis = alt.Axis(values=ticks) if log_x else alt.Undefined
    xs = alt.X(f"{x}:{x_type}", title=x_title or x, scale=scale, axis=axis)
    tips = [alt.Tooltip(f"{series}:N"), alt.Tooltip(f"{x}:{x_type}"),
            alt.Tooltip("mean:Q", format=".3f"), alt.Tooltip("se:Q", format=".3f")]
    color = alt.Color(f"{series}:N", title=series, scale=colour_scale(d[series]),
                      legend=alt.Legend(orient="bottom", columns=4) if column else alt.Undefined)
    line = alt.Chart().mark_line(point=True).encode(x=xs, y=alt.Y("mean:Q", title=y_title),
                                                   color=color, tooltip=tips)
    # caps 8 pixels wide: the default reaches into the neighbouring lags of a narrow panel
    err = alt.Chart().mark_errorbar(ticks=True, size=8).encode(x=xs, y=alt.Y("lo:Q", title=y_title),
                                                               y2="hi:Q", color=color, tooltip=tips)
    layered = alt.layer(line, err, data=d).properties(width=min(width, 220) if column else width)
    if column:
        return layered.facet(facet=alt.Facet(f"{column}:N", title=None, sort=None),
                             columns=FACET_COLUMNS).properties(title=title)
    return layered.properties(title=title)


# --------------------------------------------------------------------------- tables 2, 5
@placeholder_if_empty
def comparison_bars(frame: pd.DataFrame, title: str, setting_title: str = "setting",
                    x_title: str = "SyncR²") -> alt.Chart:
    """Horizontal grouped bars for a two-setting table, ours and the paper's side by side.

    ``frame`` columns: ``label`` (e.g. ``"ours: S-S"``, ``"paper: M2&M2"``), ``setting``,
    ``mean``, ``se``, ``source``.
    """
    need_columns(frame, ["label", "setting", "mean", "se", "source"], "comparison_bars")
    d = with_bounds(frame)
    ys = alt.Y("label:N", title=None, sort=None)
    yo = alt.YOffset("setting:N", sort=None)
    tips = [alt.Tooltip("label:N", title="pair"), alt.Tooltip("setting:N"),
            alt.Tooltip("source:N"), alt.Tooltip("mean:Q", format=".3f"),
            alt.Tooltip("se:Q", format=".3f")]
    bars = alt.Chart().mark_bar().encode(
        y=ys, yOffset=yo, x=alt.X("mean:Q", title=x_title),
        color=alt.Color("setting:N", title=setting_title, sort=None, scale=colour_scale(d["setting"])),
        tooltip=tips)
    err = alt.Chart().mark_errorbar(ticks=True).encode(y=ys, yOffset=yo,
                                                       x=alt.X("lo:Q", title=x_title), x2="hi:Q")
    return alt.layer(bars, err, data=d).properties(title=title, width=380)
