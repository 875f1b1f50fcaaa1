"""Every run size renders: each notebook executes on runs at the edges of what the config accepts,
and where a quantity cannot be computed its page says so in a sentence (no "nan" in the text).

The runs are synthetic results directories (``synthetic.build_synthetic_results``:
cubes in the schema of a simulation, analysed by :func:`synclib.analysis.analyze`, the code path
of a real run), each with one ordered run and one simulation seed:

* no map fitted: 4 tasks x 4 utterances with the paper's ``n_samples = 6500``, whose split
  gives the test set every sample (every grid is NaN: the configuration that broke figure 1)
  and no lags;
* one episode (no other dialog: no pseudo-dyads);
* dialogs that all end at utterance 2 (one reply each; no lag has a sample);
* every optional block off (no lags, relationships, persona split, MLPs, sample sizes, ToM).

Each run's claims are judged (``claims.write``, the main job's claims step) before its notebooks run: every
notebook that reads a run, the first page (``notebooks/intro.md``) and the embedded models' page among them
(the pages that read none, how to reproduce and the benchmarks, do not change with the run).
"""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import nbformat
import numpy as np
import pytest

from book_fixtures import (NOTEBOOKS, ROOT, execute_notebook, html_outputs, missing_glue, page_text, results_params,
                           vegalite_specs)
from synclib.analysis import claims, results
from synthetic import SYNTHETIC_PAIRS, Planted, build_synthetic_results

ONE_RUN = SYNTHETIC_PAIRS[:1]
NO_BLOCKS = dict(lags=(), persona_disjoint=False, relationship=False, nonlinear=False, sample_sizes=None, tom=False)
RUNS = {
    "no map fitted": dict(n_episodes=4, n_rounds=2, analyze_kwargs=dict(lags=(), n_samples=6500)),
    "one episode": dict(n_episodes=1, n_rounds=4),
    "dialogs end at utterance 2": dict(n_episodes=6, n_rounds=1, cube_kwargs=dict(planted=Planted(min_utterances=2))),
    "no optional block": dict(n_episodes=12, n_rounds=4, analyze_kwargs=NO_BLOCKS),
}
#: a number that could not be computed, printed as Python prints it
NOT_A_NUMBER = re.compile(r"(?<![\w.])(nan|NaN|inf|None)(?![\w])")


def _build(root, spec: dict):
    """The run's results directory, its claims judged as the main job's claims step does."""
    root = build_synthetic_results(root, pairs=ONE_RUN, n_seeds=1, **spec)
    claims.write(results.load_results(root), results.load_published())
    return root


def _texts(nb) -> tuple[list[str], list[str]]:
    """A notebook's words as a reader sees them (its Markdown with the glued values, and the Markdown its cells
    wrote) and its HTML tables (not its charts)."""
    tables = [h for h in html_outputs(nb) if "<table" in h and "vega" not in h.lower()]
    return [page_text(nb)], tables


@pytest.mark.slow
@pytest.mark.long  # about 50 s each; the tiny book of tests/test_book.py renders every notebook daily
@pytest.mark.parametrize("name", list(RUNS))
def test_every_notebook_renders_a_degenerate_run(name, tmp_path):
    root = _build(tmp_path / "results", RUNS[name])
    out = tmp_path / "executed"
    out.mkdir()

    def run(nb):
        return nb.stem, execute_notebook(nb, out / f"{nb.stem}.ipynb", results_params(nb, root))

    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(pool.map(run, [nb for nb in NOTEBOOKS if results_params(nb, root)]))  # those that read a run
    failed = {stem: (p.stderr.strip().splitlines() or ["?"])[-1] for stem, p in procs.items() if p.returncode}
    assert not failed, f"{name}: {failed}"
    gaps = {stem: g for stem in procs if (g := missing_glue(nbformat.read(out / f"{stem}.ipynb", as_version=4)))}
    assert not gaps, f"{name}: sentences with values never glued: {gaps}"
    for stem in procs:
        md, tables = _texts(nbformat.read(out / f"{stem}.ipynb", as_version=4))
        for text in md:
            m = NOT_A_NUMBER.search(text)
            assert m is None, f"{name}, {stem}: {text[max(0, m.start() - 200):m.end() + 40]!r}"
        for html in tables:
            assert not re.search(r">\s*(nan|NaN|None)\s*<", html), f"{name}, {stem}: a table shows NaN"
    # the first page and the embedded models' page (their run summaries were written from Python) are among them
    assert {"intro", "embedded_models"} <= set(procs)


@pytest.mark.slow
def test_figure1_says_why_no_map_was_drawn(tmp_path):
    """With every grid NaN, figure 1's page keeps the dialog and its states, draws no scatter, and its
    sentence gives the reason the analysis recorded (the split left no training sample)."""
    root = _build(tmp_path / "r", RUNS["no map fitted"])
    res = results.load_results(root)
    assert not np.isfinite(res.analysis(res.example_run())["r2_mean"].sel(condition="genuine", direction="A->B")).any()
    out = tmp_path / "fig01.ipynb"
    nb = ROOT / "notebooks" / "fig01_framework.md"
    proc = execute_notebook(nb, out, results_params(nb, root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    executed = nbformat.read(out, as_version=4)
    # (1) the dialog's turns, as a table; (2) the states, drawn; (3) no map, so no scatter
    assert any("<table" in h and "utterance" in h for h in html_outputs(executed))
    titles = [json.dumps(s.get("title"), ensure_ascii=False) for s in vegalite_specs(executed)]
    assert len(titles) == 1 and "Each layer's state over the dialog" in titles[0], titles
    text = page_text(executed)
    # the reason, from the analysis' note on its split
    m = re.search(r"No map is drawn: the genuine A→B dataset holds 8 samples, and no split seed could fit a map "
                  r"\((.*?)\)\. A run with more samples", text, re.S)
    assert m, text[-2000:]
    assert "leaves none of the 8 available for training" in m.group(1)
