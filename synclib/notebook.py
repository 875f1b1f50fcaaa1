"""The figure notebooks: their shared first step (:func:`setup`), executing them, and how a page shows a chart.

The notebooks in ``notebooks/`` are MyST Markdown text notebooks (jupytext, so a change is a readable diff).
:func:`execute` turns one into an ``.ipynb`` and runs it with papermill (parameters injected into the cell
tagged ``parameters``); the book renders the executed copies in ``book/executed/``.  Command lines
(:mod:`synclib.cli.notebooks`)::

    # chosen notebooks (all without names) against a results directory -> RESULTS/executed/
    synclib notebooks --results results/embedded fig02 fig03 -p direction "B->A"
    # one notebook, as the main job and the tests run it
    python -m synclib.cli.notebooks notebooks/fig02_heatmaps.md out.ipynb -p results_dir results/embedded
    # papermill itself reads .ipynb only: pipe the text notebook through jupytext
    jupytext --to ipynb -o - notebooks/fig02_heatmaps.md | papermill - out.ipynb -p results_dir results/embedded
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

from synclib.paths import NOTEBOOK_DIR, display
from synclib.stats import fmt, format_p, p_clause

__all__ = ["setup", "choose", "check_parameters", "refuse_unknown_parameters", "NotebookParameterError", "NotebookFailed",
           "failure", "execute", "read", "parameters", "parameter_table", "figure_notebooks",
           "enable", "chart_png", "readable", "join_words", "p_text", "leaning", "synclib_imports"]

#: notebooks a local run executes at once, each in its own kernel: a kernel mostly uses one core, so two take
#: about half as long on 2 cores; at most 4 (each kernel holds a few hundred MiB)
AT_ONCE = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

#: the first line of every notebook's own parameters cell; papermill's injected cell starts "# Parameters"
PARAMETERS_HEADER = "# Parameters (papermill replaces these"


class NotebookParameterError(ValueError):
    """A notebook parameter that cannot be used, in one line saying what is valid: inside a kernel IPython
    shows only that line (``_render_traceback_``), not a traceback through synclib."""

    def _render_traceback_(self) -> list[str]:
        return [f"synclib: {self}"]


class NotebookFailed(RuntimeError):
    """A notebook cell raised: a one-line message (:func:`failure`), ``details`` the full traceback, for a log."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details

    def __reduce__(self):  # crosses processes (a Dask worker) with its details
        return type(self), (str(self), self.details)


def figure_notebooks() -> list[Path]:
    """The book's notebooks (MyST Markdown text notebooks in ``notebooks/``), sorted."""
    return sorted(NOTEBOOK_DIR.glob("*.md"))


def choose(names) -> list[Path]:
    """The notebooks ``names`` name, each by its stem (``fig02_heatmaps``) or a unique prefix of one
    (``fig02``); every notebook for none.  Raises ValueError naming a name that matches none or several."""
    every = figure_notebooks()
    if not names:
        return every
    out = []
    for name in names:
        stem = Path(name).stem if name.endswith(".md") else name
        hits = [nb for nb in every if nb.stem == stem] or [nb for nb in every if nb.stem.startswith(stem)]
        if len(hits) != 1:
            what = "matches none" if not hits else f"matches {', '.join(h.stem for h in hits)}"
            raise ValueError(f"notebook {name!r} {what}; choose from {', '.join(nb.stem for nb in every)}")
        out += [h for h in hits if h not in out]
    return out


def setup(results_dir, **params):
    """What every figure notebook does first: check its parameters (``params``: those naming parts of the run,
    :func:`check_parameters`), turn on the charts' theme and renderer (:func:`enable`), load the results of
    ``results_dir`` (absolute or repository-relative) and ``data/published.json``, and name the run.  Returns
    ``(res, published)``.  Raises :class:`NotebookParameterError` (one line) for an undeclared parameter, a
    results directory that is not one, or a value :func:`check_parameters` refuses."""
    from IPython.display import Markdown, display

    # lazy: xarray loads in the kernel's process only (the dry run stays light)
    from synclib.analysis import results

    if refuse_unknown_parameters():
        short_tracebacks()
    try:
        res = results.load_results(results_dir)
    except results.ResultsError as exc:
        raise NotebookParameterError(f"results_dir = {results_dir!r}: {exc}") from None
    check_parameters(res, **params)
    enable()
    published = results.load_published()
    synthetic = ("**Synthetic test data.** These numbers come from a random generator used by the test suite; "
                 "they are not results of any model.\n\n" if res.synthetic else "")
    display(Markdown(synthetic + res.describe()))
    return res, published


def _assigned(source: str) -> set[str]:
    """The names a cell's top-level assignments bind."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Name)}


def refuse_unknown_parameters() -> bool:
    """Refuse a name papermill injected (``# Parameters`` cell) that the notebook's parameters cell does not declare
    (a misspelling papermill only warns about), listing the declared ones.  Returns whether papermill injected any."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the book extra
        return False
    ip = get_ipython()
    cells = list(ip.user_ns.get("In") or []) if ip is not None else []
    own = [c for c in cells if c.startswith(PARAMETERS_HEADER)]
    injected = [c for c in cells if c.startswith("# Parameters\n")]
    if own and injected:
        declared = _assigned(own[-1])
        unknown = sorted(_assigned(injected[-1]) - declared)
        if unknown:
            raise NotebookParameterError(f"unknown parameter {unknown[0]!r}: this notebook's parameters are "
                                         f"{', '.join(sorted(declared))}")
    return bool(injected)


#: the second line of a failing cell's error output under papermill (:func:`short_tracebacks`)
TRACEBACK_NOTE = "(the full traceback is in this cell's stderr output above)"


def _where(tb) -> str:
    """Where ``tb`` went wrong, as ```line``` -> file:line in function``: the cell's line, then the innermost
    frame in synclib (else the innermost; an installed package's path from the package on)."""
    frames = traceback.extract_tb(tb)
    cell = next((f for f in frames if f.name == "<module>"), None)  # a cell runs as a module's code
    home = str(Path(__file__).resolve().parent) + os.sep
    ours = [f for f in frames if str(Path(f.filename).resolve()).startswith(home)]
    f = (ours or frames[-1:] or [None])[-1]
    path = display(f.filename).split("site-packages" + os.sep)[-1] if f is not None else ""  # pandas/core/...
    parts = [f"`{cell.line}`" if cell is not None and cell.line else "",
             f"{path}:{f.lineno} in {f.name}" if f is not None and f is not cell else ""]
    return " -> ".join(p for p in parts if p)


def short_tracebacks() -> None:
    """Under papermill (:func:`setup`), a cell that raises reports two lines, the exception where it happened
    (:func:`_where`) and :data:`TRACEBACK_NOTE`, and prints the full traceback to the cell's stderr, which the
    executed notebook keeps: papermill's and ``synclib run``'s messages stay short.  JupyterLab keeps IPython's."""
    from IPython import get_ipython

    def handler(shell, etype, value, tb, tb_offset=None):
        if hasattr(value, "_render_traceback_"):  # synclib's own one-line refusals
            stb = value._render_traceback_()
        else:
            print("".join(traceback.format_exception(etype, value, tb)), file=sys.stderr, end="", flush=True)
            where = _where(tb)
            stb = [f"{etype.__name__}: {(str(value).splitlines() or [''])[0]}" + (f", at {where}" if where else ""),
                   TRACEBACK_NOTE]
        shell._showtraceback(etype, value, stb)  # the cell's error output (IPython leaves it to the handler)
        return stb

    ip = get_ipython()
    if ip is not None:
        ip.set_custom_exc((Exception,), handler)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def failure(exc, executed) -> tuple[str, str]:
    """A notebook's failure (``exc``: papermill's ``PapermillExecutionError``; ``executed``: the notebook it wrote)
    as ``(line, details)``: ``cell In [N] raised NAME: message, at `the cell's line` -> synclib/FILE:LINE in
    FUNCTION; the executed notebook is PATH`` (without :func:`short_tracebacks`, the cell's first code line stands
    for where), and the cell's stderr (the full traceback) and error output without terminal colours."""
    import nbformat

    tb = [_ANSI.sub("", t) for t in (exc.traceback or [])]
    if len(tb) == 2 and tb[1] == TRACEBACK_NOTE:
        what = tb[0]
    else:
        src = next((ln.strip() for ln in str(exc.source or "").splitlines()
                    if ln.strip() and not ln.lstrip().startswith("#")), "")
        what = f"{exc.ename}: {(str(exc.evalue).splitlines() or [''])[0]}, in the cell starting `{src}`"
    line = f"cell In [{exc.exec_count}] raised {what}; the executed notebook is {display(executed)}"
    details = []
    try:
        cells = [c for c in nbformat.read(str(executed), as_version=4).cells
                 if c.cell_type == "code" and c.get("execution_count") == exc.exec_count]
        details = [o.get("text", "") for c in cells[-1:] for o in c.get("outputs", []) if o.get("name") == "stderr"]
    except (OSError, ValueError):
        pass
    details.append("\n".join(tb))
    return line, _ANSI.sub("", "\n".join(d for d in details if d)).strip()


def check_parameters(res, **params) -> None:
    """Check the parameters that name parts of a run against ``res`` (others are the notebook's): ``runs`` (None,
    a run name or a list) and ``example_run`` (None or a run name) must be ordered runs of the results;
    ``direction`` one of the analyses' directions; ``vmax`` (None or > 0) and ``panel_size`` (None or pixels,
    at least 100) size the heatmaps.  Raises :class:`NotebookParameterError` naming the parameter and what is valid."""
    def bad(name, value, valid):
        raise NotebookParameterError(f"{name} = {value!r}: {valid}")

    runs = res.run_names
    for name in ("runs", "example_run"):
        value = params.get(name)
        if value is None:
            continue
        names = [value] if isinstance(value, str) else value
        if (name == "example_run" and not isinstance(value, str)) or not isinstance(names, (list, tuple)):
            bad(name, value, f"a run name{' or a list of them' if name == 'runs' else ''}; this run has "
                             f"{', '.join(runs)}")
        for n in names:
            if n not in runs:
                bad(name, value, f"{n!r} is not an ordered run of {res.manifest.get('name', 'this run')}; "
                                 f"choose from {', '.join(runs)}")
    if (d := params.get("direction")) is not None:
        valid = [str(x) for x in res.analysis(runs[0])["direction"].values]
        if d not in valid:
            bad("direction", d, f"choose from {', '.join(valid)}")
    if (v := params.get("vmax")) is not None and not (isinstance(v, (int, float)) and v > 0):
        bad("vmax", v, "None (the data's largest R²) or a number > 0")
    if (v := params.get("panel_size")) is not None and not (isinstance(v, int) and v >= 100):
        bad("panel_size", v, "None (the default) or a whole number of pixels, at least 100")


def synclib_imports(source: str, root) -> list[str]:
    """The package's modules (dotted names) that ``source``, a module's code or a text notebook (its code
    cells), imports anywhere in it; ``root`` is the folder holding ``synclib/``."""
    import ast

    if source.startswith("---"):  # a text notebook: its code cells, without IPython's magics
        import jupytext

        source = "\n".join(c.source for c in jupytext.reads(source, fmt="md:myst").cells if c.cell_type == "code")
        source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "synclib"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "synclib":
            out.append(node.module)
            base = Path(root).joinpath(*node.module.split("."))
            out += [f"{node.module}.{a.name}" for a in node.names
                    if (base / f"{a.name}.py").is_file() or (base / a.name).is_dir()]
    return out


def read(path):
    """A notebook as an ``nbformat`` object, from MyST Markdown (``.md``) or ``.ipynb``."""
    import jupytext

    return jupytext.read(str(path))


def parameters(path) -> dict:
    """The parameters a notebook declares (papermill's reading of its ``parameters`` cell)."""
    import papermill as pm

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / (Path(path).stem + ".ipynb")
        _write_ipynb(path, tmp)
        return dict(pm.inspect_notebook(str(tmp)))


def parameter_table(path) -> list[dict]:
    """A notebook's parameters cell as rows ``name``, ``default`` (source text), ``meaning`` (the line's comment)."""
    import ast

    cell = next((c for c in read(path).cells if c.cell_type == "code"
                 and "parameters" in c.get("metadata", {}).get("tags", [])), None)
    rows = []
    for line in (cell.source.splitlines() if cell is not None else []):
        code, _, comment = line.partition("  #")
        try:
            body = ast.parse(code.strip()).body
        except SyntaxError:
            continue
        node = body[0] if body else None
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            rows.append({"name": node.targets[0].id, "default": ast.get_source_segment(code.strip(), node.value),
                         "meaning": comment.strip()})
    return rows


def _write_ipynb(src, dst) -> None:
    import nbformat

    nbformat.write(read(src), str(dst))


def execute(nb, out, params: dict | None = None, *, kernel: str = "python3", hide_parameters: bool = True):
    """Execute notebook ``nb`` (``.md``/``.ipynb``) into ``out`` (``.ipynb``) with papermill in kernel ``kernel``,
    dropping ``params`` it does not declare; ``hide_parameters`` tags the injected cell ``remove-cell``.  Raises
    ``papermill.PapermillExecutionError`` when a cell raises (the partly executed notebook is left at ``out``)."""
    import nbformat
    import papermill as pm

    from jupyter_client.manager import KernelManager

    nb, out = Path(nb), Path(out)
    declared = parameters(nb)
    params = {k: v for k, v in (params or {}).items() if k in declared}
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / (nb.stem + ".ipynb")
        _write_ipynb(nb, src)
        # Unix sockets in this private folder, not unencrypted TCP on localhost (the kernel warns about that)
        km = KernelManager(kernel_name=kernel, transport="ipc", ip=str(Path(d) / "kernel"))
        try:
            pm.execute_notebook(str(src), str(out), parameters=params, cwd=str(nb.parent), progress_bar=False,
                                kernel_name=kernel, km=km)
        finally:  # a kernel manager handed in is not shut down by papermill
            if km.has_kernel:
                km.shutdown_kernel(now=True)
    if hide_parameters:
        doc = nbformat.read(str(out), as_version=4)
        for cell in doc.cells:
            tags = cell.get("metadata", {}).get("tags", [])
            if "injected-parameters" in tags and "remove-cell" not in tags:
                cell.metadata.setdefault("tags", []).append("remove-cell")
        nbformat.write(doc, str(out))


# --------------------------------------------------------------------------- how a page shows a chart
#: the chart renderer :func:`enable` registers with altair
RENDERER = "synclib"
#: vegaEmbed's options in the book: SVG, and the export menu only
EMBED_OPTIONS = {"renderer": "svg", "actions": {"export": True, "source": False, "compiled": False, "editor": False}}


def chart_png(spec: dict, scale: float = 1.0) -> bytes:
    """A PNG of a Vega-Lite spec, drawn by vl-convert (no browser, no network)."""
    import altair as alt
    import vl_convert as vlc

    return vlc.vegalite_to_png(spec, vl_version=alt.SCHEMA_VERSION.lstrip("v").rsplit(".", 1)[0], scale=scale)


def _title(spec: dict) -> str:
    t = spec.get("title")
    t = t.get("text") if isinstance(t, dict) else t
    return " ".join(map(str, t)) if isinstance(t, list) else str(t or "")


def chart_html(spec: dict, png: bytes | None = None) -> str:
    """A chart's ``text/html``: the PNG in a div, replaced by the interactive chart where the page has
    ``vegaEmbed`` (served from ``_static/vendor``, never a CDN); without it or without JavaScript, the PNG stays."""
    import base64
    import html
    import json
    import uuid

    div = f"synclib-vega-{uuid.uuid4().hex[:12]}"
    img = ""
    if png is not None:
        alt_text = html.escape(str(spec.get("description") or _title(spec) or "chart"), quote=True)
        img = f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{alt_text}" style="max-width:100%">'
    return (f'<div class="synclib-vega" id="{div}">{img}</div>\n<script type="text/javascript">\n(function () {{\n'
            f"  var el = document.getElementById({json.dumps(div)});\n"
            f"  var spec = {json.dumps(spec).replace('</', '<' + chr(92) + '/')};\n"
            "  function draw() {\n    if (typeof window.vegaEmbed !== 'function') { return; }\n"
            "    var keep = el.innerHTML;\n"
            f"    window.vegaEmbed(el, spec, {json.dumps(EMBED_OPTIONS)}).then(function () {{\n"
            "      el.setAttribute('data-rendered', 'true');\n    }).catch(function (err) {\n"
            "      el.innerHTML = keep; el.setAttribute('data-error', String(err));\n    });\n  }\n"
            "  if (document.readyState === 'complete') { draw(); }\n"
            "  else { window.addEventListener('load', draw); }\n})();\n</script>")


def _quantitative_fields(spec) -> list[set[str]]:
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
            out += _quantitative_fields(sub)
    if isinstance(spec.get("spec"), dict):  # a facet's or a repeat's inner chart
        out += _quantitative_fields(spec["spec"])
    return out


def nothing_to_draw(spec: dict) -> str | None:
    """Why ``spec`` would be an empty frame, or None: its inline data are empty, or no record has a
    finite value in every field a mark draws on a quantitative axis (every SyncR² NaN: too few samples)."""
    import math

    datasets = list((spec.get("datasets") or {}).values())
    records = [r for rows in datasets for r in rows if isinstance(r, dict)]
    if datasets and not records:
        return "no data in this run for this chart"
    leaves = _quantitative_fields(spec)
    if not leaves or not records:
        return None

    def finite(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if any(all(finite(r.get(f)) for f in fields) for fields in leaves for r in records):
        return None
    return "no finite value in this run for this chart (too few samples to fit the maps?)"


def offline_renderer(spec: dict, **metadata) -> dict:
    """Altair's renderer for the pages: the Vega-Lite spec, :func:`chart_html` and the PNG (PDF, plain viewers), with
    :data:`synclib.theme.CHART_CONFIG` under the chart's own config; a chart with nothing to draw becomes a sentence."""
    import base64
    import html

    import altair as alt

    # lazy: altair (the book extra) loads only where a page draws
    from synclib.theme import CHART_CONFIG

    if why := nothing_to_draw(spec):
        title = _title(spec) or "Chart"
        return {"text/html": f'<p class="synclib-placeholder"><b>{html.escape(title)}</b>: not drawn. '
                             f"{html.escape(why[0].upper() + why[1:])}.</p>",
                "text/plain": f"{title}: not drawn. {why[0].upper() + why[1:]}."}
    config = dict(spec.get("config") or {})
    for key, values in CHART_CONFIG.items():
        config[key] = {**values, **(config.get(key) or {})}
    spec = {**spec, "config": config}
    png = chart_png(spec) if metadata.get("png", True) else None
    bundle = {f"application/vnd.vegalite.v{alt.SCHEMA_VERSION.lstrip('v').split('.')[0]}+json": spec,
              "text/html": chart_html(spec, png), "text/plain": f"<Vega-Lite chart: {_title(spec) or 'untitled'}>"}
    if png is not None:
        bundle["image/png"] = base64.b64encode(png).decode()
    return bundle


def enable(png: bool = True) -> None:
    """Register and enable :func:`offline_renderer`, lift altair's 5000-row cap and, in a kernel, show a
    DataFrame with one header row (:func:`flat_table`)."""
    import altair as alt
    import pandas as pd

    if RENDERER not in alt.renderers.names():
        alt.renderers.register(RENDERER, offline_renderer)
    alt.renderers.enable(RENDERER, png=png)
    alt.data_transformers.disable_max_rows()
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the book extra
        return
    if (shell := get_ipython()) is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, _table_html)


def flat_table(frame):
    """``frame`` with one header row, and whether to show its index: named index levels become first
    columns, column levels are joined with " / " (pandas writes a second header row for either)."""
    import pandas as pd

    out = frame.copy()
    if isinstance(out.columns, pd.MultiIndex):
        out.columns = [" / ".join(str(v) for v in col if str(v) != "") for col in out.columns]
    out.columns.name = None
    if any(n is not None for n in out.index.names):
        out.index.names = [n if n is not None else f"level {i}" for i, n in enumerate(out.index.names)]
        return out.reset_index(), False
    return out, True


def _table_html(frame) -> str:
    import pandas as pd

    try:
        flat, index = flat_table(frame)
    except ValueError:  # reset_index: "cannot insert NAME, already exists"
        return frame._repr_html_()
    if index:
        return flat._repr_html_()
    return flat.to_html(index=False, notebook=True, max_rows=pd.get_option("display.max_rows"),
                        max_cols=pd.get_option("display.max_columns"))


def readable(table, digits: int = 3):
    """``table`` as a page shows it: no row numbers, numbers to ``digits`` decimals, columns named ``p``
    or ending in `` p`` as :func:`synclib.stats.format_p` writes p-values, missing values as a dash."""
    import html

    import numpy as np
    import pandas as pd

    def cell(write):
        return lambda x: "–" if x is None or not np.isfinite(x) else write(x)

    fmt = {c: cell(lambda x: html.escape(format_p(x))) if c == "p" or str(c).endswith(" p")
           else cell(lambda x: f"{x:.{digits}f}") for c in table.columns if pd.api.types.is_float_dtype(table[c])}
    return table.style.hide(axis="index").format(fmt, na_rep="–", escape="html").set_table_attributes(
        'class="dataframe"')


def join_words(items) -> str:
    """``"a, b and c"``: the non-empty ``items`` as a page lists them."""
    items = [str(i) for i in items if i]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""


def leaning(claim: dict) -> str:
    """The sentence an inconclusive claim's line ends with (:data:`synclib.analysis.claims.INCONCLUSIVE`), or ``""``."""
    return (f" At its raw p the verdict would be *{claim['leaning']}*; after Holm's adjustment across the claims' "
            "tests it is not, so the claim is inconclusive, leaning that way." if claim.get("leaning") else "")


def p_text(measure: dict, word: str = "test") -> str:
    """A claim's p as every page writes it, linked to the one description of its test on the power page:
    ``"p = 0.0042, Holm-adjusted 0.033 ([test](#claims-test))"`` (``measure``: a claim's measure)."""
    p, holm = measure["p"], measure.get("p_holm", float("nan"))
    adjusted = f", Holm-adjusted {fmt(holm, 2 if holm >= 0.01 else 3)}" if holm == holm and holm != p else ""
    return f"{p_clause(p)}{adjusted} ([{word}](#claims-test))"
