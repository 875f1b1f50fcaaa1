"""Shared set-up for tests/test_notebooks.py and tests/test_book.py.

A tiny results directory (synthetic cubes -> ``analyze`` -> a synthetic judge table, see
:func:`synclib.analysis.results.build_synthetic_results`), every notebook executed on it with
papermill, and a copy of the book sources with those executed notebooks, built with
jupyter-book.  Each step is done once per test session and cached here, because both test
modules need the executed notebooks.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.md"))
_CACHE: dict[str, object] = {}


def kernel_env() -> dict:
    """The environment for papermill kernels: synclib importable from the checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLBACKEND", "Agg")
    return env


def tiny_results(base: Path) -> Path:
    """The tiny synthetic results directory (built once per session)."""
    if "results" not in _CACHE:
        from synclib.analysis.synthetic import build_synthetic_results

        _CACHE["results"] = build_synthetic_results(base / "tiny-results")
    return _CACHE["results"]


def execute_notebook(nb: Path, out: Path, params: dict) -> subprocess.CompletedProcess:
    """Run one notebook with papermill (``python -m synclib.cli.notebooks``, what the main job does)
    in a separate process, so runs can overlap."""
    cmd = [sys.executable, "-m", "synclib.cli.notebooks", str(nb), str(out)]
    for k, v in params.items():
        cmd += ["-p", k, str(v)]
    return subprocess.run(cmd, capture_output=True, text=True, env=kernel_env(), timeout=600)


def executed_notebooks(base: Path) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Every notebook executed on :func:`tiny_results`, two at a time: ``{stem: (path, proc)}``."""
    if "executed" not in _CACHE:
        results = tiny_results(base)
        out_dir = base / "executed"
        out_dir.mkdir(parents=True, exist_ok=True)

        def run(nb: Path):
            out = out_dir / f"{nb.stem}.ipynb"
            return nb.stem, (out, execute_notebook(nb, out, {"results_dir": results}))

        with ThreadPoolExecutor(max_workers=2) as pool:
            _CACHE["executed"] = dict(pool.map(run, NOTEBOOKS))
    return _CACHE["executed"]


def built_book(base: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """A copy of the book sources with the executed notebooks, built: ``(html_dir, proc)``."""
    if "book" not in _CACHE:
        from synclib.figures import benchmarks, run_summary, scorecard
        from synclib.analysis import results
        from synclib.config import invalidation_table

        executed = executed_notebooks(base)
        src = base / "book-src"
        if src.exists():
            shutil.rmtree(src)
        (src / "book").mkdir(parents=True)
        for f in ("_config.yml", "_toc.yml"):
            shutil.copy2(ROOT / f, src / f)
        for md in (ROOT / "book").glob("*.md"):
            shutil.copy2(md, src / "book" / md.name)
        shutil.copytree(ROOT / "book" / "_static", src / "book" / "_static")
        (src / "book" / "executed").mkdir()
        for stem, (path, proc) in executed.items():
            if proc.returncode == 0:
                shutil.copy2(path, src / "book" / "executed" / path.name)
        gen = src / "book" / "_generated"
        gen.mkdir()
        res = results.load_results(tiny_results(base))
        (gen / "run_summary.md").write_text(run_summary.run_summary_markdown(res))
        (gen / "embedded_run.md").write_text(run_summary.embedded_run_markdown(res))
        (gen / "penalty.md").write_text(run_summary.penalty_markdown(res))
        (gen / "overview.png").write_bytes(scorecard.overview_png(res))
        (gen / "overview.md").write_text(scorecard.overview_markdown(res, results.load_published()))
        (gen / "benchmarks.md").write_text(benchmarks.benchmarks_markdown(ROOT / "bench" / "results"))
        (gen / "settings.md").write_text(invalidation_table())
        from synclib.notebook import parameters_markdown

        (gen / "parameters.md").write_text(parameters_markdown())
        exe = Path(sys.executable).with_name("jupyter-book")
        proc = subprocess.run([str(exe), "build", str(src), "--builder", "html"],
                              capture_output=True, text=True, env=kernel_env(), timeout=600)
        _CACHE["book"] = (src / "_build" / "html", proc)
    return _CACHE["book"]
