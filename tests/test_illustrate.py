"""Figure 1 (``notebooks/fig01_framework.md``): drawn from a run's own dialog, states and map.

The page is the executed notebook of the tiny results (tests/book_fixtures.py): what it shows is checked
against the cube and the analysis it was drawn from.
"""
from __future__ import annotations

import json
import re

import nbformat
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from book_fixtures import (ROOT, copy_results, execute_notebook, executed_notebooks, glued, html_outputs, page_text,
                           tiny_results, vegalite_specs)
from synclib.analysis import results
from synclib.stats import fmt

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def res(tmp_path_factory):
    return results.load_results(tiny_results(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="session")
def page(tmp_path_factory):
    path, proc = executed_notebooks(tmp_path_factory.getbasetemp())["fig01_framework"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    return nbformat.read(path, 4)


def _table(html: str) -> pd.DataFrame:
    """An HTML table's header and body cells as text (a page's :func:`synclib.notebook.readable` table)."""
    from bs4 import BeautifulSoup

    table = BeautifulSoup(html, "html.parser").find("table")
    head = [th.get_text() for th in table.find("thead").find_all("th")]
    rows = [[td.get_text() for td in tr.find_all(["td", "th"])] for tr in table.find("tbody").find_all("tr")]
    return pd.DataFrame(rows, columns=head).astype({"utterance": int})


def _data(spec: dict) -> pd.DataFrame:
    """A chart's inline records (the first non-empty dataset of its spec)."""
    return pd.DataFrame(next(rows for rows in spec["datasets"].values() if rows))


def test_figure1_is_the_runs_own_dialog_states_and_map(res, page):
    values = glued(page)
    run = values["run"]
    assert run == res.example_run()
    e, seed = int(values["episode"]), int(values["sim_seed"])
    turns = _table(next(h for h in html_outputs(page) if "<table" in h))
    specs = vegalite_specs(page)
    states = _data(next(s for s in specs if "Each layer's state" in json.dumps(s.get("title"), ensure_ascii=False)))
    with xr.open_dataset(res.run(run).cube) as cube:
        s = int(np.flatnonzero(cube["sim_seed"].values == seed)[0])
        # (1) the dialog's first utterances, as the cube stores them
        n = int(cube["n_utterances"].values[e, s])
        assert n == int(values["utterances"]) == int(cube["n_utterances"].values.max())  # one that reached the limit
        assert list(turns["utterance"]) == list(range(min(n, 4))) == list(range(int(values["shown"])))
        assert turns["text"].iloc[1] == str(cube["text_b"].values[e, s, 0])
        assert turns["text"].iloc[2] == str(cube["text_a"].values[e, s, 1])
        assert turns["speaker"].iloc[0] == str(cube["agent1_name"].values[e])
        assert turns["speaker"].iloc[1] == str(cube["agent2_name"].values[e])
        # (2) every layer of both agents at each of their utterances
        for i, side in enumerate("ab"):
            a = states[states["agent"].str.endswith("(A)" if i == 0 else "(B)")]
            assert a["layer"].nunique() == cube.sizes[f"layer_{side}"]
            assert sorted(a["utterance"].unique()) == list(range(i, n, 2))
            assert np.isfinite(a["value"]).all()
    # (3) the refitted map scores what the analysis scored for that layer pair and split (the page says so)
    text = page_text(page)
    m = re.search(r"The ridge map from agent 1's layer (\d+) to agent 2's layer (\d+) \(the A→B layer pair with the "
                  r"highest mean test R² in this run, (-?[\d.]+) over split seeds\), refitted on split seed (\d+) "
                  r"with the analysis' split \((\d+) training and (\d+) test samples\).*?Its test R² over all \6 "
                  r"samples and every dimension is (-?[\d.]+), (.*?) \((-?[\d.]+)\)\.", text, re.S)
    assert m, text[-3000:]
    src, tgt, best, split_seed, n_train, n_test, r2, same, analysis_r2 = m.groups()
    ana = res.analysis(run)
    grid = ana["r2_mean"].sel(condition="genuine", direction="A->B").values
    assert best == fmt(np.nanmax(grid)) and grid[int(src) - 1, int(tgt) - 1] == np.nanmax(grid)
    scored = float(ana["r2"].sel(condition="genuine", direction="A->B", split_seed=int(split_seed))
                   .values[int(src) - 1, int(tgt) - 1])
    assert analysis_r2 == f"{scored:.3f}"
    assert same == "the analysis' own value for this layer pair and split" and r2 == analysis_r2
    scatter = _data(next(s for s in specs if "layer" in s and f"layer {src} → agent 2 layer {tgt}"
                         in json.dumps(s.get("title"), ensure_ascii=False)))
    assert len(scatter) == int(n_test) > 0 and np.isfinite(scatter[["actual", "predicted"]]).all(axis=None)
    assert int(n_train) > 0


def test_figure1_needs_the_cube(res, tmp_path_factory, tmp_path):
    root = copy_results(tmp_path_factory.getbasetemp(), tmp_path / "results")
    (root / "cubes" / f"{res.example_run()}.nc").unlink()
    out = tmp_path / "fig01.ipynb"
    proc = execute_notebook(ROOT / "notebooks" / "fig01_framework.md", out, {"results_dir": root})
    assert proc.returncode != 0
    assert f"FileNotFoundError: figure 1 needs the cube of run {res.example_run()!r}" in proc.stderr, \
        proc.stderr[-3000:]
