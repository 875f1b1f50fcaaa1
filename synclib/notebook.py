"""The figure notebooks: their shared first step, and executing one.

The notebooks in ``notebooks/`` are MyST Markdown text notebooks (jupytext): a change to one
is a readable diff.  :func:`execute` turns one into an ``.ipynb`` and runs it with papermill
(parameters injected into the cell tagged ``parameters``); the book renders the executed
copies in ``book/executed/``.

Command line (what the tests and the main job run)::

    python -m synclib.notebook notebooks/fig02_heatmaps.md out.ipynb -p results_dir results/embedded
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

__all__ = ["setup", "execute", "read", "parameters"]


def setup(results_dir):
    """What every figure notebook does first: interactive charts on, the run's results and
    the paper's published numbers loaded, the run's banner shown.

    Parameters
    ----------
    results_dir : results directory (absolute, or relative to the repository root)

    Returns
    -------
    res : synclib.results.Results
    published : dict, the paper's numbers (``data/published.json``)
    """
    from IPython.display import Markdown, display

    from synclib import plots, report, results

    plots.enable()
    res = results.load_results(results_dir)
    published = results.load_published()
    display(Markdown(report.banner(res) + res.describe()))
    return res, published


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

    nb, out = Path(nb), Path(out)
    declared = parameters(nb)
    params = {k: v for k, v in (params or {}).items() if k in declared}
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / (nb.stem + ".ipynb")
        _write_ipynb(nb, src)
        pm.execute_notebook(str(src), str(out), parameters=params, cwd=str(nb.parent), progress_bar=False,
                            kernel_name=kernel)
    if hide_parameters:
        doc = nbformat.read(str(out), as_version=4)
        for cell in doc.cells:
            tags = cell.get("metadata", {}).get("tags", [])
            if "injected-parameters" in tags and "remove-cell" not in tags:
                cell.metadata.setdefault("tags", []).append("remove-cell")
        nbformat.write(doc, str(out))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m synclib.notebook", description=execute.__doc__.splitlines()[0])
    p.add_argument("notebook")
    p.add_argument("out")
    p.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="a parameter (repeatable); values are passed as strings")
    p.add_argument("-k", "--kernel", default="python3")
    args = p.parse_args(argv)
    try:
        execute(args.notebook, args.out, dict(args.p), kernel=args.kernel)
    except Exception as exc:  # noqa: BLE001 - the CLI reports, the caller reads the exit status
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
