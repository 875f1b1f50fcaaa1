"""The figure notebooks: their shared first step, and executing them.

The notebooks in ``notebooks/`` are MyST Markdown text notebooks (jupytext): a change to one
is a readable diff.  :func:`execute` turns one into an ``.ipynb`` and runs it with papermill
(parameters injected into the cell tagged ``parameters``); the book renders the executed
copies in ``book/executed/``.

Command lines (:mod:`synclib.cli.notebooks`)::

    # chosen notebooks (all without names) against a results directory -> RESULTS/executed/
    synclib notebooks --results results/embedded fig02 fig06 -p ability_scores my_scores.csv
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

from synclib.figures import report
from synclib.figures.verdicts import page_lines
from synclib.paths import NOTEBOOK_DIR, display

__all__ = ["setup", "claim_lines", "check_parameters", "refuse_unknown_parameters", "NotebookParameterError", "NotebookFailed",
           "failure", "execute", "read", "parameters", "parameter_table", "parameters_markdown", "figure_notebooks"]

#: how many notebooks a local run executes at once, each in a kernel of its own: a kernel spends
#: most of its time on one core (start-up, pandas, plotting), so on 2 cores two at a time take
#: about half as long as one after the other; at most 4 (each kernel holds a few hundred MiB)
AT_ONCE = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

#: the first line of every notebook's own parameters cell; papermill's injected cell starts "# Parameters"
PARAMETERS_HEADER = "# Parameters (papermill replaces these"


class NotebookParameterError(ValueError):
    """A notebook parameter that cannot be used, in one line that says what is valid.

    Inside a kernel (papermill, ``synclib notebooks``, JupyterLab) IPython shows only that line
    (``_render_traceback_``), not a traceback through synclib."""

    def _render_traceback_(self) -> list[str]:
        return [f"synclib: {self}"]


class NotebookFailed(RuntimeError):
    """A notebook a cell of which raised: the message is one line (the notebook, the cell, the
    exception, where the executed copy is kept; :func:`failure`), ``details`` the cell's full
    traceback, for a log."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details

    def __reduce__(self):  # crosses processes (a Dask worker) with its details
        return type(self), (str(self), self.details)


def figure_notebooks() -> list[Path]:
    """The figure notebooks (MyST Markdown text notebooks in ``notebooks/``), sorted."""
    return sorted(NOTEBOOK_DIR.glob("*.md"))


def setup(results_dir, **params):
    """What every figure notebook does first: its parameters checked, interactive charts on,
    the run's results and the paper's published numbers loaded, the run's banner shown.

    Parameters
    ----------
    results_dir : results directory (absolute, or relative to the repository root)
    **params : the notebook's other parameters that name parts of the run, checked by
        :func:`check_parameters` (e.g. ``runs``, ``example_run``, ``direction``)

    Returns
    -------
    res : synclib.analysis.results.Results
    published : dict, the paper's numbers (``data/published.json``)

    Raises
    ------
    NotebookParameterError
        a parameter papermill passed that the notebook does not declare, a results directory
        that is not one, or a value :func:`check_parameters` refuses (one line each).
    """
    from IPython.display import Markdown, display

    # lazy: xarray loads in the kernel's process only (the dry run stays light)
    from synclib.analysis import results
    # lazy: altair (the book extra) only for the pages
    from synclib.figures import charts

    if refuse_unknown_parameters():
        short_tracebacks()
    try:
        res = results.load_results(results_dir)
    except results.ResultsError as exc:
        raise NotebookParameterError(f"results_dir = {results_dir!r}: {exc}") from None
    check_parameters(res, **params)
    charts.enable()
    published = results.load_published()
    display(Markdown(report.banner(res) + res.describe()))
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
    """Every notebook's first check (:func:`setup` calls it): a name papermill injected (its
    ``# Parameters`` cell) that the notebook's own parameters cell does not declare is a
    misspelling; refuse it, listing the declared ones (papermill only warns and runs with the
    default).  Returns whether papermill injected parameters (the notebook runs under it)."""
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
    """Where ``tb`` went wrong: the cell's own line, then the innermost frame in synclib (else the
    innermost at all; an installed package's path from the package on), as
    ```line``` -> file:line in function``."""
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
    """In a kernel papermill drives (:func:`setup` calls it there): a cell that raises reports
    two lines, the exception with where it happened (:func:`_where`) and :data:`TRACEBACK_NOTE`,
    and prints the full traceback to the cell's stderr, where the executed notebook keeps it.  So
    papermill's message, and the line ``synclib run`` prints (:func:`failure`), stay short.
    JupyterLab keeps IPython's tracebacks."""
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
    """A notebook's failure (``exc``: papermill's ``PapermillExecutionError``; ``executed``: the
    executed notebook papermill wrote) in one line and in full.

    Returns
    -------
    line : str
        ``cell In [N] raised NAME: message, at `the cell's line` -> synclib/FILE:LINE in FUNCTION;
        the executed notebook is PATH`` (:func:`short_tracebacks`; without it, the cell's first
        line of code stands for where)
    details : str
        The cell's stderr (the full traceback) and its error output, without terminal colours:
        for a log.
    """
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
    """Check the parameters that name parts of a run against ``res``
    (:class:`synclib.analysis.results.Results`); others are left to the notebook.

    ``runs`` (None, a run name or a list of them) and ``example_run`` (None or a run name) must
    be ordered runs of the results; ``direction`` one of the analyses' directions; ``vmax``
    (None or a number > 0) and ``panel_size`` (None or pixels, at least 100) size the heatmaps.

    Raises
    ------
    NotebookParameterError
        naming the parameter, its value and what is valid.
    """
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
    """A notebook's parameters as its parameters cell writes them: ``name``, ``default`` (the
    source text) and ``meaning`` (the line's comment)."""
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


def parameters_markdown() -> str:
    """Markdown for ``book/_generated/parameters.md``: every notebook's parameters, read from the
    notebooks themselves, so the page cannot go stale."""
    lines = ["| notebook | parameter | default | meaning |", "| --- | --- | --- | --- |"]
    for nb in figure_notebooks():
        for row in parameter_table(nb):
            meaning = row["meaning"].replace("|", "\\|") or "—"
            lines.append(f"| `{nb.stem}` | `{row['name']}` | `{row['default']}` | {meaning} |")
    return "\n".join(lines) + "\n"


def _write_ipynb(src, dst) -> None:
    import nbformat

    nbformat.write(read(src), str(dst))


def execute(nb, out, params: dict | None = None, *, kernel: str = "python3", hide_parameters: bool = True):
    """Execute notebook ``nb`` (``.md`` or ``.ipynb``) into ``out`` (``.ipynb``) with papermill.

    Parameters
    ----------
    nb, out : paths
    params : values for the parameters cell; names the notebook does not declare are dropped
    kernel : Jupyter kernel name
    hide_parameters : tag papermill's injected-parameters cell ``remove-cell`` (the book
        need not show it)

    Raises
    ------
    papermill.PapermillExecutionError
        when a cell raises (the partly executed notebook is left at ``out``).
    """
    import nbformat
    import papermill as pm

    from jupyter_client.manager import KernelManager

    nb, out = Path(nb), Path(out)
    declared = parameters(nb)
    params = {k: v for k, v in (params or {}).items() if k in declared}
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / (nb.stem + ".ipynb")
        _write_ipynb(nb, src)
        # the kernel talks over Unix sockets in this private folder, not unencrypted TCP on
        # localhost (which the kernel warns about on every run)
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


def claim_lines(figure, res, published: dict) -> str:
    """Markdown: a figure's claims of the paper as the first page lists them (``figure``: the page's
    module in :mod:`synclib.figures`, whose ``CLAIMS`` they are)."""
    return page_lines(figure.CLAIMS, res, published)
