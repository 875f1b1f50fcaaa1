"""Altair charts for the notebooks, and an offline renderer for them.

Every chart function takes a tidy :class:`pandas.DataFrame` (built by
:mod:`synclib.results`) and returns an altair chart with tooltips.  Nothing here computes
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
"""
from __future__ import annotations

import base64
import html
import json
import uuid

import altair as alt
import numpy as np
import pandas as pd

RENDERER = "synclib"
VEGALITE_MIME = f"application/vnd.vegalite.v{alt.SCHEMA_VERSION.lstrip('v').split('.')[0]}+json"
NEGATIVE_GREY = "#c8c8c8"
HEATMAP_SCHEME = "viridis"
PNG_SCALE = 1.0
EMBED_OPTIONS = {"renderer": "svg", "actions": {"export": True, "source": False,
                                                "compiled": False, "editor": False}}


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


def offline_renderer(spec: dict, **metadata) -> dict:
    """Altair renderer: a MIME bundle with the spec, offline HTML and a PNG (see module doc)."""
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
    """Register and enable the offline ``synclib`` renderer; lift altair's 5000-row cap."""
    if RENDERER not in alt.renderers.names():
        alt.renderers.register(RENDERER, offline_renderer)
    alt.renderers.enable(RENDERER, png=png)
    alt.data_transformers.disable_max_rows()


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
                                     height=18 * len(lines))


def _placeholder_if_empty(func):
    """Decorator: an empty ``frame`` (first argument) gives a :func:`placeholder` chart."""
    import functools

    @functools.wraps(func)
    def wrapper(frame, *args, **kw):
        if isinstance(frame, pd.DataFrame) and frame.empty:
            title = kw.get("title", args[0] if args and isinstance(args[0], str) else "")
            return placeholder(title, "no data in this run for this chart")
        return func(frame, *args, **kw)

    return wrapper


def _with_bounds(frame: pd.DataFrame, mean: str = "mean", se: str = "se") -> pd.DataFrame:
    out = frame.copy()
    s = out[se].fillna(0.0) if se in out else 0.0
    out["lo"] = out[mean] - s
    out["hi"] = out[mean] + s
    return out


def _need(frame: pd.DataFrame, cols, what: str) -> None:
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise KeyError(f"{what}: frame lacks column(s) {missing}; has {list(frame.columns)}")


# --------------------------------------------------------------------------- figure 2, 3
@_placeholder_if_empty
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
    _need(frame, ["src_layer", "tgt_layer", value, "best"], "r2_heatmap")
    d = frame.dropna(subset=[value]).rename(columns={value: "r2"})
    if d.empty:
        return placeholder(title, f"no finite {value_title} in this run for this panel (too few samples?)")
    top = float(vmax if vmax is not None else max(d["r2"].max(), 1e-6))
    base = alt.Chart(d).encode(
        x=alt.X("src_layer:O", title=src_title, axis=alt.Axis(labelAngle=0, values=_ticks(d["src_layer"]))),
        y=alt.Y("tgt_layer:O", title=tgt_title, sort="descending", axis=alt.Axis(values=_ticks(d["tgt_layer"]))),
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


def _ticks(layers: pd.Series, most: int = 8) -> list[int]:
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
    rows = [alt.hconcat(*panels[i:i + columns]) for i in range(0, len(panels), columns)]
    return alt.vconcat(*rows).resolve_scale(color="shared")


@_placeholder_if_empty
def generalisation_scatter(frame: pd.DataFrame, title: str, size: int = 360, floor: float = -1.0) -> alt.LayerChart:
    """Test R² (y) against training R² (x), one point per layer pair, coloured by ordered run,
    with the diagonal (test = training: no loss) and a rule at test R² 0.

    ``frame``: :meth:`synclib.results.Results.generalisation_table` (``run, direction,
    src_layer, tgt_layer, train_r2, test_r2, gap``).  Test R² below ``floor`` is drawn at
    ``floor`` (the title says so; hover shows the value).
    """
    cols = ["run", "direction", "source", "target", "src_layer", "tgt_layer", "train_r2", "test_r2", "gap"]
    _need(frame, cols, "generalisation_scatter")
    d = frame[cols].dropna(subset=["train_r2", "test_r2"]).round({"train_r2": 4, "test_r2": 4, "gap": 4})
    vals = np.r_[d["train_r2"].to_numpy(float), d["test_r2"].to_numpy(float)]
    lo, hi = min(max(float(vals.min()), floor), 0.0), max(float(vals.max()), 1e-6)
    if (d["test_r2"] < floor).any():
        title = f"{title} (test R² below {floor:g} drawn at {floor:g})"
    scale = alt.Scale(domain=[lo, hi], clamp=True)
    points = alt.Chart(d).mark_circle(size=30, opacity=0.6).encode(
        x=alt.X("train_r2:Q", title="training R² (mean over split seeds)", scale=scale),
        y=alt.Y("test_r2:Q", title="test R² (mean over split seeds)", scale=scale),
        color=alt.Color("run:N", title="ordered run", legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("run:N", title="ordered run"), alt.Tooltip("direction:N"),
                 alt.Tooltip("source:N", title="source model"), alt.Tooltip("target:N", title="target model"),
                 alt.Tooltip("src_layer:O", title="source layer"), alt.Tooltip("tgt_layer:O", title="target layer"),
                 alt.Tooltip("train_r2:Q", title="training R²", format=".3f"),
                 alt.Tooltip("test_r2:Q", title="test R²", format=".3f"),
                 alt.Tooltip("gap:Q", title="training − test", format=".3f")])
    diagonal = alt.Chart(pd.DataFrame({"x": [lo, hi], "y": [lo, hi]})).mark_line(
        color="grey", strokeDash=[4, 3]).encode(x="x:Q", y="y:Q")
    zero = alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="black", strokeWidth=0.8).encode(y="y:Q")
    return alt.layer(diagonal, zero, points).properties(
        title=alt.TitleParams(wrap_title(title, size + 60, 13)), width=size, height=size)


# --------------------------------------------------------------------------- bars / lines
@_placeholder_if_empty
def grouped_bars(frame: pd.DataFrame, x: str, group: str, title: str, y_title: str = "SyncR²",
                 column: str | None = None, x_title: str | None = None,
                 group_title: str | None = None, sort=None, width: int = 220,
                 wrap: int = 2) -> alt.Chart:
    """Bars of ``mean`` by ``x`` and ``group`` with ± standard-error bars.

    Parameters
    ----------
    frame : DataFrame
        Columns ``x``, ``group``, ``mean``, ``se`` (and ``column`` when faceting); extra
        columns show in the tooltip.
    column, wrap : facet by ``column``, ``wrap`` panels per row (with the legend below,
        two panels fit a book's text column)
    """
    _need(frame, [x, group, "mean", "se"] + ([column] if column else []), "grouped_bars")
    d = _with_bounds(frame)
    extra = [c for c in d.columns if c not in {x, group, "mean", "se", "lo", "hi", column}]
    tips = [alt.Tooltip(f"{x}:N"), alt.Tooltip(f"{group}:N"),
            alt.Tooltip("mean:Q", format=".3f"), alt.Tooltip("se:Q", format=".3f")]
    tips += [alt.Tooltip(f"{c}:N") for c in extra if d[c].dtype == object]
    xs = alt.X(f"{x}:N", title=x_title or x, sort=sort, axis=alt.Axis(labelAngle=0, labelExpr=WRAPPED_LABEL))
    bars = alt.Chart().mark_bar().encode(
        x=xs, xOffset=alt.XOffset(f"{group}:N", sort=None),
        y=alt.Y("mean:Q", title=y_title),
        color=alt.Color(f"{group}:N", title=group_title or group, sort=None,
                        legend=alt.Legend(orient="bottom") if column else alt.Undefined), tooltip=tips)
    err = alt.Chart().mark_errorbar(ticks=True).encode(
        x=xs, xOffset=alt.XOffset(f"{group}:N", sort=None),
        y=alt.Y("lo:Q", title=y_title), y2="hi:Q", tooltip=tips)
    layered = alt.layer(bars, err, data=d).properties(width=width)
    if column:
        return layered.facet(facet=alt.Facet(f"{column}:N", title=None, sort=None),
                             columns=wrap).properties(title=title)
    return layered.properties(title=title)


@_placeholder_if_empty
def lines_with_se(frame: pd.DataFrame, x: str, series: str, title: str,
                  y_title: str = "SyncR²", x_title: str | None = None,
                  column: str | None = None, x_type: str = "O", log_x: bool = False,
                  width: int = 260, wrap: int = 2) -> alt.Chart:
    """Lines of ``mean`` against ``x``, one per ``series``, with ± SE bars.

    Parameters
    ----------
    frame : DataFrame
        Columns ``x``, ``series``, ``mean``, ``se`` (and ``column`` when faceting).
    x_type : {"O", "Q"}
        Ordinal (lags) or quantitative (sample sizes) x axis.
    column, wrap : facet by ``column``, ``wrap`` panels of 220 pixels per row, legend below
    """
    _need(frame, [x, series, "mean", "se"] + ([column] if column else []), "lines_with_se")
    d = _with_bounds(frame)
    scale = alt.Scale(type="log") if log_x else alt.Undefined
    xs = alt.X(f"{x}:{x_type}", title=x_title or x, scale=scale,
               axis=alt.Axis(labelAngle=0) if x_type == "O" else alt.Undefined)
    tips = [alt.Tooltip(f"{series}:N"), alt.Tooltip(f"{x}:{x_type}"),
            alt.Tooltip("mean:Q", format=".3f"), alt.Tooltip("se:Q", format=".3f")]
    color = alt.Color(f"{series}:N", title=series,
                      legend=alt.Legend(orient="bottom", columns=4) if column else alt.Undefined)
    line = alt.Chart().mark_line(point=True).encode(x=xs, y=alt.Y("mean:Q", title=y_title),
                                                   color=color, tooltip=tips)
    err = alt.Chart().mark_errorbar(ticks=True).encode(x=xs, y=alt.Y("lo:Q", title=y_title),
                                                       y2="hi:Q", color=color, tooltip=tips)
    layered = alt.layer(line, err, data=d).properties(width=min(width, 220) if column else width)
    if column:
        return layered.facet(facet=alt.Facet(f"{column}:N", title=None, sort=None),
                             columns=wrap).properties(title=title)
    return layered.properties(title=title)


@_placeholder_if_empty
def rounds_lines(frame: pd.DataFrame, title: str, column: str = "pair", wrap: int = 2) -> alt.Chart:
    """SyncR² per round (:func:`synclib.rounds.round_table`): a line per condition with its
    interval as a band, one panel per ``column``; points of rounds too thin for the trend
    (``kept`` false) hollow.

    Parameters
    ----------
    frame : DataFrame
        Columns ``round``, ``condition``, ``mean``, ``ci_lo``, ``ci_hi``, ``n_test``, ``kept``
        and ``column``.
    """
    _need(frame, ["round", "condition", "mean", "ci_lo", "ci_hi", "n_test", "kept", column], "rounds_lines")
    xs = alt.X("round:O", title="round of the dialog", axis=alt.Axis(labelAngle=0))
    color = alt.Color("condition:N", title="condition", sort=None,
                      legend=alt.Legend(orient="bottom", columns=4, symbolOpacity=1, symbolType="circle"))
    tips = [alt.Tooltip(f"{column}:N"), alt.Tooltip("condition:N"), alt.Tooltip("round:O"),
            alt.Tooltip("mean:Q", format=".3f", title="SyncR²"), alt.Tooltip("ci_lo:Q", format=".3f"),
            alt.Tooltip("ci_hi:Q", format=".3f"), alt.Tooltip("n_test:Q", format=".1f", title="test samples")]
    band = alt.Chart().mark_area(opacity=0.15).encode(x=xs, y=alt.Y("ci_lo:Q", title="SyncR² of the round"),
                                                       y2="ci_hi:Q", color=color)
    line = alt.Chart().mark_line().encode(x=xs, y="mean:Q", color=color)
    points = alt.Chart().mark_point(size=40).encode(
        x=xs, y="mean:Q", color=color, tooltip=tips,
        fill=alt.condition("datum.kept", alt.Color("condition:N", sort=None, legend=None),
                           alt.value("white")))
    layered = alt.layer(band, line, points, data=frame).properties(width=220)
    panels = list(dict.fromkeys(frame[column]))
    return layered.facet(facet=alt.Facet(f"{column}:N", title=None, sort=panels), columns=wrap).properties(title=title)


# --------------------------------------------------------------------------- figure 5
@_placeholder_if_empty
def distribution_by_category(frame: pd.DataFrame, category: str, value: str, title: str,
                             order_by: str | None = None, color: str | None = None,
                             y_title: str = "SyncR²") -> alt.LayerChart:
    """Box plots of ``value`` per ``category`` with every sample as a hoverable point.

    ``order_by`` names a numeric column that orders the categories (e.g. the relationship
    code, from strangers to family).
    """
    _need(frame, [category, value] + ([color] if color else []) + ([order_by] if order_by else []),
          "distribution_by_category")
    order = (list(frame.sort_values(order_by)[category].drop_duplicates()) if order_by
             else None)
    xs = alt.X(f"{category}:N", sort=order, title=category, axis=alt.Axis(labelAngle=0, labelExpr=WRAPPED_LABEL))
    box = alt.Chart().mark_boxplot(extent="min-max", opacity=0.5).encode(
        x=xs, y=alt.Y(f"{value}:Q", title=y_title))
    tips = [alt.Tooltip(f"{c}:N") for c in frame.columns if frame[c].dtype == object]
    tips.append(alt.Tooltip(f"{value}:Q", format=".3f"))
    pts = alt.Chart().mark_circle(size=30, opacity=0.8).encode(
        x=xs, y=f"{value}:Q", xOffset=alt.XOffset(f"{color}:N") if color else alt.Undefined,
        color=alt.Color(f"{color}:N") if color else alt.value("black"), tooltip=tips)
    return alt.layer(box, pts, data=frame).properties(title=title, width=420)


@_placeholder_if_empty
def surrogate_strip(frame: pd.DataFrame, title: str, y_title: str = "SyncR²") -> alt.LayerChart:
    """Each pair's surrogate values as grey points and its genuine value as a red bar: ``frame``
    with columns ``pair``, ``kind`` ("surrogate" or "genuine"), ``surrogate`` and ``value``."""
    _need(frame, ["pair", "kind", "value"], "surrogate_strip")
    xs = alt.X("pair:N", title="model pair", sort=None, axis=alt.Axis(labelAngle=0, labelExpr=WRAPPED_LABEL))
    tips = [alt.Tooltip("pair:N"), alt.Tooltip("kind:N"), alt.Tooltip("value:Q", format=".3f")]
    pts = alt.Chart(frame[frame["kind"] == "surrogate"]).mark_circle(size=40, opacity=0.6, color="grey").encode(
        x=xs, y=alt.Y("value:Q", title=y_title), xOffset=alt.XOffset("jitter:Q"), tooltip=tips + ["surrogate:O"]
    ).transform_calculate(jitter="random()")
    gen = alt.Chart(frame[frame["kind"] == "genuine"]).mark_tick(color="firebrick", thickness=3, size=40).encode(
        x=xs, y="value:Q", tooltip=tips)
    return alt.layer(pts, gen).properties(title=title, width=320)


# --------------------------------------------------------------------------- figure 6, 7
@_placeholder_if_empty
def sync_vs_social(frame: pd.DataFrame, title: str) -> alt.LayerChart:
    """SyncR² (y) against social performance (x), one point per pair, coloured by family.

    ``frame`` columns: ``pair, family, social, sync, sync_se, fit``; a least-squares line
    is drawn per family only for rows with ``fit`` true (families with at least 3 pairs).
    """
    _need(frame, ["pair", "family", "social", "sync", "sync_se", "fit"], "sync_vs_social")
    d = _with_bounds(frame, mean="sync", se="sync_se")
    tips = [alt.Tooltip("pair:N"), alt.Tooltip("family:N"),
            alt.Tooltip("social:Q", title="social performance", format=".3f"),
            alt.Tooltip("sync:Q", title="SyncR²", format=".3f"),
            alt.Tooltip("sync_se:Q", title="SE", format=".3f")]
    xs = alt.X("social:Q", title="social performance (judge, mean of 7 dimensions)",
               scale=alt.Scale(zero=False))
    color = alt.Color("family:N", title="family")
    pts = alt.Chart().mark_circle(size=90).encode(x=xs, y=alt.Y("sync:Q", title="SyncR²"),
                                                  color=color, tooltip=tips)
    err = alt.Chart().mark_errorbar().encode(x=xs, y=alt.Y("lo:Q", title="SyncR²"), y2="hi:Q",
                                             color=color)
    labels = alt.Chart().mark_text(dx=8, align="left").encode(x=xs, y="sync:Q", text="pair:N")
    layers = [pts, err, labels]
    if bool(d["fit"].any()):
        layers.append(alt.Chart().transform_filter(alt.datum.fit).transform_regression(
            "social", "sync", groupby=["family"]).mark_line(strokeDash=[4, 3]).encode(
            x="social:Q", y="sync:Q", color=color))
    return alt.layer(*layers, data=d).properties(title=title, width=420, height=300)


@_placeholder_if_empty
def correlation_vs_k(frame: pd.DataFrame, title: str) -> alt.Chart:
    """Pearson r against top-k, one series per group; point size marks p < 0.05.

    ``frame`` columns: ``group, k, r, p, significant`` (rows with NaN r are dropped; when
    none is left, a :func:`placeholder` gives the ``reason`` column's reasons).
    """
    _need(frame, ["group", "k", "r", "p", "significant"], "correlation_vs_k")
    d = frame.dropna(subset=["r"]).copy()
    if d.empty:
        reasons = sorted(set(frame["reason"].dropna())) if "reason" in frame else []
        return placeholder(title, "no correlation computable: " + ("; ".join(reasons) or "no data"))
    d["significance"] = np.where(d["significant"], "p < 0.05", "p ≥ 0.05")
    return alt.Chart(d).mark_line(point=True).encode(
        x=alt.X("k:O", title="top-k target layers", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("r:Q", title="Pearson r with social performance", scale=alt.Scale(domain=[-1, 1])),
        color=alt.Color("group:N", title="family", legend=alt.Legend(orient="bottom")),
        shape=alt.Shape("group:N", title="family", legend=alt.Legend(orient="bottom")),
        size=alt.Size("significance:N", scale=alt.Scale(domain=["p < 0.05", "p ≥ 0.05"], range=[120, 30]),
                      legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("group:N"), alt.Tooltip("k:O"), alt.Tooltip("r:Q", format=".3f"),
                 alt.Tooltip("p:Q", format=".3g")],
    ).properties(title=title, width=560,  # the whole chart, legends included, fits the text column
                 autosize=alt.AutoSizeParams(type="fit-x", contains="padding"))


# --------------------------------------------------------------------------- figure 8
@_placeholder_if_empty
def clipping_panels(frame: pd.DataFrame, title: str, x: str = "pair", x_title: str = "model pair") -> alt.VConcatChart:
    """Upper panel: SyncR² with and without clipping; lower: its SE on a log scale.

    ``frame`` columns: ``pair, family, method, mean, se`` and ``x`` (the bars' groups, e.g. a
    pair and a ridge penalty).
    """
    _need(frame, ["pair", "family", "method", "mean", "se", x], "clipping_panels")
    d = _with_bounds(frame)
    tips = [alt.Tooltip(f"{x}:N"), alt.Tooltip("family:N"), alt.Tooltip("method:N"),
            alt.Tooltip("mean:Q", format=".3f"), alt.Tooltip("se:Q", format=".3g")]
    xs = alt.X(f"{x}:N", title=x_title, sort=None, axis=alt.Axis(labelAngle=0, labelLimit=160))
    xo = alt.XOffset("method:N")
    color = alt.Color("method:N", title="negative R²")
    upper = alt.layer(
        alt.Chart().mark_bar().encode(x=xs, xOffset=xo, y=alt.Y("mean:Q", title="SyncR²"),
                                      color=color, tooltip=tips),
        alt.Chart().mark_errorbar(ticks=True).encode(x=xs, xOffset=xo,
                                                     y=alt.Y("lo:Q", title="SyncR²"), y2="hi:Q"),
        data=d).properties(width=420, height=200, title="SyncR²")
    pos = d[d["se"] > 0]
    lower = alt.Chart(pos).mark_point(filled=True, size=70).encode(
        x=xs, xOffset=xo, y=alt.Y("se:Q", title="standard error (log scale)",
                                  scale=alt.Scale(type="log")),
        color=color, tooltip=tips).properties(width=420, height=160,
                                              title="standard error of SyncR²")
    return alt.vconcat(upper, lower).properties(title=title)


# --------------------------------------------------------------------------- figure 1
@_placeholder_if_empty
def state_heatmaps(frame: pd.DataFrame, title: str, width: int = 250) -> alt.Chart:
    """Figure 1 (2): each agent's states over one dialog, layer by layer.

    ``frame`` columns: ``agent``, ``layer`` (1-based), ``utterance``, ``value`` (the state
    projected on the layer's first principal component, standardised per layer).
    """
    _need(frame, ["agent", "layer", "utterance", "value"], "state_heatmaps")
    lim = float(np.nanmax(np.abs(frame["value"]))) or 1.0
    return alt.Chart(frame).mark_rect().encode(
        x=alt.X("utterance:O", title="utterance", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("layer:O", title="layer", sort="descending", axis=alt.Axis(values=_ticks(frame["layer"]))),
        color=alt.Color("value:Q", title="first PC (sd)", scale=alt.Scale(scheme="redblue", domain=[-lim, lim])),
        column=alt.Column("agent:N", title=None, sort=None),
        tooltip=[alt.Tooltip("agent:N"), alt.Tooltip("layer:O"), alt.Tooltip("utterance:O"),
                 alt.Tooltip("value:Q", format=".2f")],
    ).properties(width=width, height=200, title=title)


@_placeholder_if_empty
@_placeholder_if_empty
def prediction_scatter(frame: pd.DataFrame, title: str, x_title: str, y_title: str, size: int = 300) -> alt.LayerChart:
    """Figure 1 (3): a map's test predictions against the actual states (``actual``,
    ``predicted``; ``episode`` on hover), with the identity line."""
    _need(frame, ["actual", "predicted"], "prediction_scatter")
    lo = float(min(frame["actual"].min(), frame["predicted"].min()))
    hi = float(max(frame["actual"].max(), frame["predicted"].max()))
    points = alt.Chart(frame).mark_circle(size=28, opacity=0.6).encode(
        x=alt.X("actual:Q", title=x_title, scale=alt.Scale(domain=[lo, hi])),
        y=alt.Y("predicted:Q", title=y_title, scale=alt.Scale(domain=[lo, hi])),
        tooltip=[alt.Tooltip(c) for c in frame.columns])
    line = alt.Chart(pd.DataFrame({"x": [lo, hi], "y": [lo, hi]})).mark_line(color="grey", strokeDash=[4, 3]).encode(
        x="x:Q", y="y:Q")
    return alt.layer(points, line).properties(title=wrap_title(title, size + 60), width=size, height=size)


# --------------------------------------------------------------------------- tables 2, 5
@_placeholder_if_empty
def comparison_bars(frame: pd.DataFrame, title: str, setting_title: str = "setting",
                    x_title: str = "SyncR²") -> alt.Chart:
    """Horizontal grouped bars for a two-setting table, ours and the paper's side by side.

    ``frame`` columns: ``label`` (e.g. ``"ours: S-S"``, ``"paper: M2&M2"``), ``setting``,
    ``mean``, ``se``, ``source``.
    """
    _need(frame, ["label", "setting", "mean", "se", "source"], "comparison_bars")
    d = _with_bounds(frame)
    ys = alt.Y("label:N", title=None, sort=None)
    yo = alt.YOffset("setting:N", sort=None)
    tips = [alt.Tooltip("label:N", title="pair"), alt.Tooltip("setting:N"),
            alt.Tooltip("source:N"), alt.Tooltip("mean:Q", format=".3f"),
            alt.Tooltip("se:Q", format=".3f")]
    bars = alt.Chart().mark_bar().encode(
        y=ys, yOffset=yo, x=alt.X("mean:Q", title=x_title),
        color=alt.Color("setting:N", title=setting_title, sort=None), tooltip=tips)
    err = alt.Chart().mark_errorbar(ticks=True).encode(y=ys, yOffset=yo,
                                                       x=alt.X("lo:Q", title=x_title), x2="hi:Q")
    return alt.layer(bars, err, data=d).properties(title=title, width=380)


# --------------------------------------------------------------------------- figure 10
@_placeholder_if_empty
def difference_histogram(frame: pd.DataFrame, title: str) -> alt.LayerChart:
    """Figure 10: histogram of judge minus human scores (``difference``, bins of 1), bars
    coloured by whether the difference lies within one standard deviation of the human
    ratings (``within``); a dashed rule marks 0.  ``frame`` is
    :func:`synclib.judge.human.differences`'s table."""
    _need(frame, ["difference", "within", "dimension"], "difference_histogram")
    data = frame.assign(within=np.where(frame["within"], "within 1 SD", "beyond 1 SD"))
    bars = alt.Chart(data).mark_bar(opacity=0.85).encode(
        x=alt.X("difference:Q", bin=alt.Bin(step=1), title="judge − human score"),
        y=alt.Y("count():Q", title="agent × dimension scores", stack=True),
        color=alt.Color("within:N", title=None,
                        scale=alt.Scale(domain=["within 1 SD", "beyond 1 SD"], range=["#4c78a8", NEGATIVE_GREY])),
        tooltip=[alt.Tooltip("within:N"), alt.Tooltip("count():Q", title="scores")])
    zero = alt.Chart(pd.DataFrame({"x": [0]})).mark_rule(color="black", strokeDash=[4, 3]).encode(x="x:Q")
    return alt.layer(bars, zero).properties(title=title, width=420, height=220)
