"""A student's edit of one page changes that page alone (issue 73): figure 2's colour scheme is chosen in
``notebooks/fig02_heatmaps.md`` itself, so an edit there redraws figure 2's heatmaps and nothing else of
the book.

In a copy of the book's sources and notebooks the heatmap cell's scheme (``theme.HEATMAP_SCHEME``, shared by
every heatmap) becomes the literal ``"magma"``; the notebook whose text changed is executed again on the tiny
results (what the pipeline re-runs: a notebook's fingerprint covers its own text, and synclib did not change),
the others are the session's, and the book is built.  ``tools/page_text.py``'s snapshots of the session's book
(before) and of this one (after), compared, differ in figure 2's heatmap chart only.
"""
from __future__ import annotations

import importlib.util
import json
import shutil

import nbformat
import pytest

from book_fixtures import (ROOT, book_sources, build_book, built_book, execute_notebook, executed_notebooks,
                           results_params, tiny_results, vegalite_specs)

pytestmark = pytest.mark.slow

PAGE = "book/executed/fig02_heatmaps.html"
OLD = "scheme=theme.HEATMAP_SCHEME"
NEW = 'scheme="magma"'


def page_text_tool():
    """``tools/page_text.py`` as a module (the tool itself, not a copy)."""
    spec = importlib.util.spec_from_file_location("page_text", ROOT / "tools" / "page_text.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_editing_figure_2s_colour_scheme_changes_only_figure_2s_chart(tmp_path_factory, tmp_path):
    base = tmp_path_factory.getbasetemp()
    before_html, proc = built_book(base)
    assert proc.returncode == 0, f"jupyter-book build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    executed = executed_notebooks(base)

    # the student's edit, in a copy of the notebooks: the heatmap cell's scheme, nothing else
    notebooks = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", notebooks)
    fig02 = notebooks / "fig02_heatmaps.md"
    source = fig02.read_text()
    assert source.count(OLD) == 1, "figure 2's heatmap cell names its colour scheme once"
    fig02.write_text(source.replace(OLD, NEW))
    changed = sorted(nb.stem for nb in notebooks.glob("*.md")
                     if nb.read_text() != (ROOT / "notebooks" / nb.name).read_text())
    assert changed == ["fig02_heatmaps"]

    # the book's sources with the session's executed notebooks, the changed one executed again
    src = tmp_path / "book-src"
    book_sources(src, executed, skip=tuple(changed))
    out = src / "book" / "executed" / "fig02_heatmaps.ipynb"
    proc = execute_notebook(fig02, out, results_params(fig02, tiny_results(base)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    heatmaps = next(s for s in vegalite_specs(nbformat.read(out, 4)) if "vconcat" in s)
    assert '"scheme": "magma"' in json.dumps(heatmaps)
    proc = build_book(src)
    assert proc.returncode == 0, f"jupyter-book build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    tool = page_text_tool()
    before, after = tool.snapshot(before_html), tool.snapshot(src / "_build" / "html")
    assert set(before) == set(after) and PAGE in before
    n = len(before[PAGE]["images"])
    assert n >= 2, "figure 2's page draws the heatmaps and the generalisation scatter"
    # the heatmaps are the page's first chart; its text, its other chart and every other page are as they were
    assert tool.compare(before, after) == [f"{PAGE}: charts differ (before {n}, after {n}; changed positions [0])"]
