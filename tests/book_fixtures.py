"""Shared set-up for the tests of the notebooks and the book (tests/test_notebooks.py, test_book.py, ...).

A tiny results directory (synthetic cubes -> ``analyze`` -> a synthetic judge table, see
tests/synthetic.py, and the claims judged on it), every notebook executed on it with papermill,
and a copy of the book sources with those executed notebooks, built with jupyter-book.  Each step
is done once per test session and cached here, because several test modules need the executed
notebooks.

The pages' words are Markdown cells with glued values (myst-nb's ``{glue:text}`name```) and the
Markdown that code cells display; :func:`page_text` puts them together as a reader sees them.
"""
from __future__ import annotations

import ast
import os
import re
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
    """The tiny synthetic results directory with its claims judged (built once per session)."""
    if "results" not in _CACHE:
        from synclib.analysis import claims, results
        from synthetic import build_synthetic_results

        root = build_synthetic_results(base / "tiny-results")
        claims.write(results.load_results(root), results.load_published(), ability_scores="data/ability_scores.csv")
        _CACHE["results"] = root
    return _CACHE["results"]


def execute_notebook(nb: Path, out: Path, params: dict) -> subprocess.CompletedProcess:
    """Run one notebook with papermill (``python -m synclib.cli.notebooks``, what the main job does)
    in a separate process, so runs can overlap."""
    cmd = [sys.executable, "-m", "synclib.cli.notebooks", str(nb), str(out)]
    for k, v in params.items():
        cmd += ["-p", k, str(v)]
    return subprocess.run(cmd, capture_output=True, text=True, env=kernel_env(), timeout=600)


def results_params(nb: Path, results: Path) -> dict:
    """``{"results_dir": results}`` for a notebook that reads a results directory, ``{}`` for one that reads
    none (the reproduce and benchmarks pages), as the main job passes only the parameters a notebook declares."""
    from synclib.notebook import parameters

    return {"results_dir": results} if "results_dir" in parameters(nb) else {}


def copy_results(base: Path, dst: Path) -> Path:
    """A copy of :func:`tiny_results` at ``dst`` (its claims.json included), for a test that judges its claims
    again with other inputs or changes its files: the session's own copy stays as the executed notebooks read it."""
    shutil.copytree(tiny_results(base), dst)
    return dst


def executed_notebooks(base: Path) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Every notebook executed on :func:`tiny_results`, two at a time: ``{stem: (path, proc)}``."""
    if "executed" not in _CACHE:
        results = tiny_results(base)
        out_dir = base / "executed"
        out_dir.mkdir(parents=True, exist_ok=True)

        def run(nb: Path):
            out = out_dir / f"{nb.stem}.ipynb"
            return nb.stem, (out, execute_notebook(nb, out, results_params(nb, results)))

        with ThreadPoolExecutor(max_workers=2) as pool:
            _CACHE["executed"] = dict(pool.map(run, NOTEBOOKS))
    return _CACHE["executed"]


def book_sources(src: Path, executed: dict, skip: tuple[str, ...] = ()) -> None:
    """Copy the book's sources into ``src`` with the executed notebooks that ran (``executed`` as
    :func:`executed_notebooks` returns it), but for the stems in ``skip``."""
    (src / "book").mkdir(parents=True)
    for f in ("_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / f, src / f)
    for md in (ROOT / "book").glob("*.md"):
        shutil.copy2(md, src / "book" / md.name)
    shutil.copytree(ROOT / "book" / "_static", src / "book" / "_static")
    (src / "book" / "executed").mkdir()
    for stem, (path, proc) in executed.items():
        if proc.returncode == 0 and stem not in skip:
            shutil.copy2(path, src / "book" / "executed" / path.name)


def build_book(src: Path) -> subprocess.CompletedProcess:
    """``jupyter-book build`` of the sources in ``src`` (HTML under ``src/_build/html``)."""
    exe = Path(sys.executable).with_name("jupyter-book")
    return subprocess.run([str(exe), "build", str(src), "--builder", "html"],
                          capture_output=True, text=True, env=kernel_env(), timeout=600)


def built_book(base: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """A copy of the book sources with the executed notebooks, built: ``(html_dir, proc)``."""
    if "book" not in _CACHE:
        src = base / "book-src"
        if src.exists():
            shutil.rmtree(src)
        book_sources(src, executed_notebooks(base))
        _CACHE["book"] = (src / "_build" / "html", build_book(src))
    return _CACHE["book"]


# --------------------------------------------------------------------------- what an executed notebook shows
def outputs(nb):
    """Every output of a notebook's code cells, in order."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            yield from cell.get("outputs", [])


def markdown_outputs(nb) -> list[str]:
    """The Markdown the code cells displayed."""
    return [o["data"]["text/markdown"] for o in outputs(nb) if "text/markdown" in o.get("data", {})]


def html_outputs(nb) -> list[str]:
    """The HTML the code cells displayed (tables, widgets, charts' HTML)."""
    return [o["data"]["text/html"] for o in outputs(nb) if "text/html" in o.get("data", {})]


def glued(nb) -> dict[str, str]:
    """``{name: text}`` of every value a notebook glued (myst-nb), as ``{glue:text}`` writes it on the page."""
    out = {}
    for o in outputs(nb):
        book = (o.get("metadata") or {}).get("scrapbook")
        if not book:
            continue
        plain = o["data"][book["mime_prefix"] + "text/plain"]
        try:
            value = ast.literal_eval(plain)
        except (ValueError, SyntaxError):
            value = plain
        out[book["name"]] = str(value)
    return out


GLUE_ROLE = re.compile(r"\{glue:text\}`([^`]+)`")


def missing_glue(nb) -> list[str]:
    """The names a notebook's Markdown puts in with ``{glue:text}`` that its cells never glued (myst-nb leaves a
    gap in the sentence and warns)."""
    used = {m.group(1) for cell in nb.cells if cell.cell_type == "markdown" for m in GLUE_ROLE.finditer(cell.source)}
    return sorted(used - set(glued(nb)))


def page_text(nb) -> str:
    """A notebook's words as a reader sees them, in order: its Markdown cells with the glued values put in,
    and the Markdown its code cells displayed.  A glued name the notebook never glued raises KeyError."""
    values = glued(nb)
    parts = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(GLUE_ROLE.sub(lambda m: values[m.group(1)], cell.source))
        elif cell.cell_type == "code":
            parts += [o["data"]["text/markdown"] for o in cell.get("outputs", [])
                      if "text/markdown" in o.get("data", {})]
    return "\n\n".join(parts)


def vegalite_specs(nb) -> list[dict]:
    """The Vega-Lite specs of the charts a notebook drew."""
    return [v for o in outputs(nb) for k, v in o.get("data", {}).items() if k.startswith("application/vnd.vegalite")]


# --------------------------------------------------------------------------- results around crafted cubes
def crafted_cube(texts, max_utterances: int = 6, tom: bool = False, tasks=None, sim_seed: int = 0,
                 tom_texts=None, readers=None):
    """A small synthetic cube (2 layers x 4 dims, one simulation seed ``sim_seed``) with one episode per entry of
    ``texts``, its stored utterances replaced by ``texts[e]`` (``n_utterances`` their number); with ``tom`` the
    ToM dialogs and read-outs of the generator, their utterances ``tom_texts[e]`` where given.  ``tasks`` (one
    task per episode, e.g. embedded ones) makes each episode that task's: its index, scenario and agent ids,
    names and codename, as a simulation stores them; ``readers`` the persona id of each episode's passive reader
    (the cube's ``passive_reader``)."""
    import numpy as np

    from synthetic import Planted, Shapes, make_synthetic_cube

    E, R = len(texts), max_utterances // 2
    cube = make_synthetic_cube(n_episodes=E, n_seeds=1, n_rounds=R,
                               shapes=Shapes(layers_a=2, dim_a=4, layers_b=2, dim_b=4), passive=False, tom=tom,
                               planted=Planted(min_utterances=1))
    for suffix, dialogs in (("", texts), ("_tom", tom_texts)):
        if dialogs is None:
            continue
        ta = np.full((E, 1, R), "", dtype=object)
        tb = np.full((E, 1, R), "", dtype=object)
        for e, utts in enumerate(dialogs):
            for t, u in enumerate(utts):
                (ta if t % 2 == 0 else tb)[e, 0, t // 2] = u
        cube[f"text_a{suffix}"] = (("episode", "sim_seed", "round"), ta)
        cube[f"text_b{suffix}"] = (("episode", "sim_seed", "round"), tb)
        cube[f"n_utterances{suffix}"] = (("episode", "sim_seed"), np.array([[len(u)] for u in dialogs], dtype=np.int32))
    if readers is not None:
        cube["passive_reader"] = (("episode", "sim_seed"), np.array([[r] for r in readers], dtype=object))
    if tasks is not None:
        column = {"task_index": [int(t.index) for t in tasks], "env_id": [t.env.pk for t in tasks],
                  "codename": [t.codename for t in tasks], "agent1_id": [t.agents[0].pk for t in tasks],
                  "agent2_id": [t.agents[1].pk for t in tasks], "agent1_name": [t.names[0] for t in tasks],
                  "agent2_name": [t.names[1] for t in tasks]}
        cube = cube.assign_coords({k: ("episode", np.array(v, dtype=np.int64 if k == "task_index" else object))
                                   for k, v in column.items()})
        cube.attrs["synthetic"] = 0
    return cube.assign_coords(sim_seed=np.array([sim_seed], dtype=np.int64))


def crafted_results(root: Path, cubes: dict, *, synthetic: bool = False, scenarios: str | None = "embedded",
                    judge: dict | None = None, config: dict | None = None) -> Path:
    """A results directory around cubes made in memory (``cubes``: ``{run name: cube}``, each its own pair of
    family "Crafted", models the cube's attributes), as ``synclib run`` lays one out: ``cubes/RUN.nc``, the
    judge tables of ``judge`` (``{run: DataFrame}``, :func:`synclib.judge.save_table`) in ``judge/``, and
    ``manifest.json`` with the config's ``scenarios`` and ``config``'s other sections.  No analysis: the
    dialogs page reads the cubes and the judge tables only."""
    import json

    from synclib.judge import save_table

    root = Path(root)
    for sub in ("cubes", "judge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    pairs = []
    for name, cube in cubes.items():
        cube.to_netcdf(root / "cubes" / f"{name}.nc")
        if judge and name in judge:
            save_table(judge[name], root / "judge" / f"{name}.judge.csv")
        pairs.append({"name": name, "pair": name, "order": 1, "model_a": str(cube.attrs.get("model_a", "a")),
                      "model_b": str(cube.attrs.get("model_b", "b")), "family": "Crafted",
                      "cube": f"cubes/{name}.nc", "analysis": f"analysis/{name}.nc",
                      "judge": f"judge/{name}.judge.csv"})
    manifest = {"name": "crafted", "synthetic": synthetic, "embedded": False,
                "config": {"scenarios": scenarios, **(config or {})}, "pairs": pairs}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root
