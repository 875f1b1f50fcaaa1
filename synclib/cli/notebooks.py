"""``synclib notebooks``: execute chosen figure notebooks (all without names) against a results directory into
``RESULTS/executed/``, after judging its claims (:func:`synclib.notebook.execute`). ``python -m
synclib.cli.notebooks NB OUT`` executes one, as the main job and the tests do::

    synclib notebooks --results results/embedded fig02 fig06 -p direction "B->A"
    python -m synclib.cli.notebooks notebooks/fig02_heatmaps.md out.ipynb -p results_dir results/embedded
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from synclib.notebook import NotebookParameterError, choose, execute, failure, parameters
from synclib.paths import CLAIMS_FILE, display

__all__ = ["configure_parser", "run", "main", "request"]


def request(names, params: dict) -> list[Path]:
    """The notebooks ``names`` choose (:func:`synclib.notebook.choose`), checked against ``params``: every
    parameter must be declared by one of them, and ``results_dir`` is ``--results``'s. Raises ValueError naming
    the notebook or parameter, and what is valid."""
    chosen = choose(names)
    if "results_dir" in params:
        raise ValueError("-p results_dir: give the results directory as --results")
    declared = {nb.stem: parameters(nb) for nb in chosen}
    unknown = [k for k in params if not any(k in d for d in declared.values())]
    if unknown:
        raise ValueError(f"-p {unknown[0]}: no chosen notebook declares this parameter (they declare "
                         f"{', '.join(sorted(set().union(*declared.values())))})")
    return chosen


def _value(text: str):
    """A ``-p`` value: YAML numbers, true/false, null and lists (``[S-G, G-S]``), anything else as text."""
    import yaml

    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return v if isinstance(v, (int, float, bool, list)) or v is None else text


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
                        help="a notebook parameter (repeatable), e.g. -p direction B->A; "
                             "numbers, true/false and null are read as such")
    parser.add_argument("-k", "--kernel", default="python3", help="Jupyter kernel (default python3)")


def _judge_claims(results: Path) -> None:
    """The claims step on ``results`` (:mod:`synclib.analysis.claims`), with the files its config's
    ``notebooks.*`` keys name, so that the pages read claims of the analyses as they are now."""
    # lazy: xarray and the tests load only when the command runs
    from synclib.analysis import claims
    from synclib.analysis.results import load_published, load_results  # lazy, as claims

    res = load_results(results)
    nb = res.config.get("notebooks") or {}
    claims.write(res, load_published(), ability_scores=nb.get("ability_scores"), ratings=nb.get("human_ratings"),
                 judge_scores=nb.get("human_judge_scores"))
    print(f"judged the claims: {display(results / CLAIMS_FILE)}", flush=True)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``synclib notebooks``: 0 when all ran, 1 when one failed (named with its cell), 2 on bad
    input (nothing run)."""
    from papermill.exceptions import PapermillExecutionError

    def fail(msg: str) -> int:
        print(f"synclib notebooks: {msg}", file=sys.stderr)
        return 2

    results = Path(args.results).expanduser().resolve()
    if not (results / "manifest.json").is_file():
        return fail(f"--results {args.results}: no manifest.json there (a results directory of `synclib run`, "
                    "e.g. results/embedded after `make book`)")
    params = {k: _value(v) for k, v in args.parameter}
    try:
        chosen = request(args.names, params)
    except ValueError as exc:
        return fail(str(exc))
    try:
        _judge_claims(results)
    except (ValueError, OSError) as exc:
        return fail(f"--results {args.results}: the claims step failed: {exc}")
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
            if exc.ename == NotebookParameterError.__name__:  # refused before computing: its one line
                print(f"synclib notebooks: {nb.stem}: {exc.evalue}", file=sys.stderr, flush=True)
                continue
            print(f"synclib notebooks: {nb.stem}: {failure(exc, dst)[0]}", file=sys.stderr, flush=True)
    if failed:
        print(f"synclib notebooks: {len(failed)} of {len(chosen)} failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"{len(chosen)} notebook(s) executed into {out}")
    return 0


def main(argv=None) -> int:
    """``python -m synclib.cli.notebooks NB OUT [-p NAME VALUE]...``: execute one notebook; 0 when it
    ran, 1 when it failed (one line on stderr), 2 for a parameter it does not declare."""
    p = argparse.ArgumentParser(prog="python -m synclib.cli.notebooks", description=execute.__doc__.splitlines()[0])
    p.add_argument("notebook")
    p.add_argument("out")
    p.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="a parameter (repeatable); numbers, true/false, null and [lists] are read as such")
    p.add_argument("-k", "--kernel", default="python3")
    args = p.parse_args(argv)
    declared = parameters(args.notebook)
    unknown = [k for k, _ in args.p if k not in declared]
    if unknown:
        print(f"synclib: unknown parameter {unknown[0]!r}: {Path(args.notebook).stem}'s parameters are "
              f"{', '.join(sorted(declared))}", file=sys.stderr)
        return 2
    try:
        execute(args.notebook, args.out, {k: _value(v) for k, v in args.p}, kernel=args.kernel)
    except Exception as exc:  # noqa: BLE001 - the CLI reports, the caller reads the exit status
        print(_one_line(exc, args.out), file=sys.stderr)
        return 1
    return 0


def _one_line(exc: Exception, out) -> str:
    """A failed notebook in one line: synclib's own refusal, the failing cell, else the exception's."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError) and exc.ename == NotebookParameterError.__name__:
        return f"synclib: {exc.evalue}"
    if isinstance(exc, PapermillExecutionError):
        return f"{Path(out).stem}: {failure(exc, out)[0]}"
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
