"""The figure notebooks: their shared first step, and executing them.

The notebooks in ``notebooks/`` are MyST Markdown text notebooks (jupytext): a change to one
is a readable diff.  :func:`execute` turns one into an ``.ipynb`` and runs it with papermill
(parameters injected into the cell tagged ``parameters``); the book renders the executed
copies in ``book/executed/``.

Command lines::

    # chosen notebooks (all without names) against a results directory -> RESULTS/executed/
    synclib notebooks --results results/embedded fig02 fig09 -p ability_scores my_scores.csv
    # one notebook, as the main job and the tests run it
    python -m synclib.notebook notebooks/fig02_heatmaps.md out.ipynb -p results_dir results/embedded
    # papermill itself reads .ipynb only: pipe the text notebook through jupytext
    jupytext --to ipynb -o - notebooks/fig02_heatmaps.md | papermill - out.ipynb -p results_dir results/embedded
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from synclib.paths import NOTEBOOK_DIR

__all__ = ["setup", "execute", "read", "parameters", "figure_notebooks"]


def figure_notebooks() -> list[Path]:
    """The figure notebooks (MyST Markdown text notebooks in ``notebooks/``), sorted."""
    return sorted(NOTEBOOK_DIR.glob("*.md"))


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


def _chosen(names) -> list[Path]:
    """The notebooks named by stem or a unique prefix of one (all of them for none)."""
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


def _value(text: str):
    """A ``-p`` value as papermill's command line reads it: YAML scalars (numbers, true/false,
    null) become Python values, anything else stays text."""
    import yaml

    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return v if isinstance(v, (int, float, bool)) or v is None else text


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``synclib notebooks``."""
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="notebooks to execute, by name (fig02_heatmaps) or a unique prefix (fig02); "
                             "default: every notebook")
    parser.add_argument("--results", required=True, metavar="DIR",
                        help="the results directory the notebooks read (its manifest.json), e.g. results/embedded")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="where the executed copies go (default: RESULTS/executed)")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a notebook parameter (repeatable), e.g. -p ability_scores my_scores.csv; "
                             "numbers, true/false and null are read as such")
    parser.add_argument("-k", "--kernel", default="python3", help="Jupyter kernel (default python3)")


def run(args: argparse.Namespace) -> int:
    """``synclib notebooks``: execute the chosen notebooks against ``--results``; 0 when all
    ran, 1 when one failed (named with its cell), 2 on bad input (nothing run)."""
    from papermill.exceptions import PapermillExecutionError

    def fail(msg: str) -> int:
        print(f"synclib notebooks: {msg}", file=sys.stderr)
        return 2

    results = Path(args.results).expanduser().resolve()
    if not (results / "manifest.json").is_file():
        return fail(f"--results {args.results}: no manifest.json there (a results directory of `synclib run`, "
                    "e.g. results/embedded after `make book`)")
    try:
        chosen = _chosen(args.names)
    except ValueError as exc:
        return fail(str(exc))
    params = {k: _value(v) for k, v in args.parameter}
    if "results_dir" in params:
        return fail("-p results_dir: give the results directory as --results")
    declared = {nb.stem: parameters(nb) for nb in chosen}
    unknown = [k for k in params if not any(k in d for d in declared.values())]
    if unknown:
        return fail(f"-p {unknown[0]}: no chosen notebook declares this parameter (they declare "
                    f"{', '.join(sorted(set().union(*declared.values())))})")
    out = Path(args.out).expanduser() if args.out else results / "executed"
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for i, nb in enumerate(chosen, 1):
        dst = out / f"{nb.stem}.ipynb"
        print(f"[{i}/{len(chosen)}] {nb.stem} -> {dst}", flush=True)
        try:
            execute(nb, dst, {"results_dir": str(results), **params}, kernel=args.kernel)
        except PapermillExecutionError as exc:
            failed.append(nb.stem)
            print(f"synclib notebooks: {nb.stem}: cell {exc.cell_index} (execution count {exc.exec_count}) raised "
                  f"{exc.ename}: {exc.evalue}; the partly executed copy is {dst}", file=sys.stderr, flush=True)
    if failed:
        print(f"synclib notebooks: {len(failed)} of {len(chosen)} failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"{len(chosen)} notebook(s) executed into {out}")
    return 0


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
