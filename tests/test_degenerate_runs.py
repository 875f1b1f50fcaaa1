"""Every run size renders: each notebook executes on runs at the edges of what the config accepts,
and where a quantity cannot be computed its page says so in a sentence (no "nan" in the text).

The runs are synthetic results directories (:func:`synclib.analysis.synthetic.build_synthetic_results`:
cubes in the schema of a simulation, analysed by :func:`synclib.analysis.analyze`, the code path
of a real run), each with one ordered run and one simulation seed:

* no map fitted: 4 tasks x 4 utterances with the paper's ``n_samples = 6500``, whose split
  gives the test set every sample (every grid is NaN: the configuration that broke figure 1)
  and no lags;
* one episode (no other dialog: no pseudo-dyads);
* dialogs that all end at utterance 2 (one reply each; no lag has a sample);
* every optional block off (no lags, relationships, persona split, MLPs, sample sizes, ToM).
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import nbformat
import pytest

from book_fixtures import NOTEBOOKS, execute_notebook
from synclib.analysis import results
from synclib.analysis.synthetic import SYNTHETIC_PAIRS, Planted, build_synthetic_results
from synclib.figures import run_summary
from synclib.figures import fig01_framework

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
    return build_synthetic_results(root, pairs=ONE_RUN, n_seeds=1, **spec)


def _texts(nb) -> tuple[list[str], list[str]]:
    """A notebook's Markdown outputs and its HTML tables (not its charts)."""
    md, tables = [], []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if "text/markdown" in data:
                md.append(data["text/markdown"])
            elif "text/html" in data and "<table" in data["text/html"] and "vega" not in data["text/html"].lower():
                tables.append(data["text/html"])
    return md, tables


@pytest.mark.slow
@pytest.mark.long  # about 50 s each; the tiny book of tests/test_book.py renders every notebook daily
@pytest.mark.parametrize("name", list(RUNS))
def test_every_notebook_renders_a_degenerate_run(name, tmp_path):
    root = _build(tmp_path / "results", RUNS[name])
    out = tmp_path / "executed"
    out.mkdir()

    def run(nb):
        return nb.stem, execute_notebook(nb, out / f"{nb.stem}.ipynb", {"results_dir": root})

    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(pool.map(run, NOTEBOOKS))
    failed = {stem: (p.stderr.strip().splitlines() or ["?"])[-1] for stem, p in procs.items() if p.returncode}
    assert not failed, f"{name}: {failed}"
    for stem in procs:
        md, tables = _texts(nbformat.read(out / f"{stem}.ipynb", as_version=4))
        for text in md:
            m = NOT_A_NUMBER.search(text)
            assert m is None, f"{name}, {stem}: {text[max(0, m.start() - 200):m.end() + 40]!r}"
        for html in tables:
            assert not re.search(r">\s*(nan|NaN|None)\s*<", html), f"{name}, {stem}: a table shows NaN"
    res = results.load_results(root)
    for page in (run_summary.run_summary_markdown(res), run_summary.embedded_run_markdown(res)):
        m = NOT_A_NUMBER.search(page)
        assert m is None, f"{name}, first page: {page[max(0, m.start() - 200):m.end() + 40]!r}"


def test_figure1_says_why_no_map_was_drawn(tmp_path):
    """With every grid NaN, figure 1 keeps the dialog and its states, draws no scatter, and its
    sentence gives the reason the analysis recorded (the split left no training sample)."""
    res = results.load_results(_build(tmp_path / "r", RUNS["no map fitted"]))
    fig = fig01_framework.figure1(res)
    assert not fig.info["fitted"] and fig.scatter.empty
    assert len(fig.turns) and len(fig.states)
    assert "holds 8 samples" in fig.info["reason"] and "leaves none of the 8 available for training" in fig.info["reason"]
    text = fig01_framework.sentence(fig, results.load_published(), res.embedded)
    assert text.startswith("No map is drawn: the genuine A→B dataset holds 8 samples")
    assert fig.scatter_title == "No A→B map was fitted in this run"
