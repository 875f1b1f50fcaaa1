"""A student's loop: edit a notebook, rebuild the book, see the change, and nothing else re-run.

On a small run of two tiny random models (the set-up of ``tests/test_resume.py``) in a copy of
the repository: a line added to a figure's notebook reaches its rendered page through the main
job (what ``make book CONFIG=...`` runs) and through ``--steps notebooks,book``, each time
re-running only that notebook and the book; switching between the two routes re-runs nothing;
a mistake in a notebook stops the run with two lines (the notebook, the cell, its line, where
the executed copy and the traceback are) and the same command resumes once it is fixed; a
checkout moved to another folder keeps every stamp (none records an absolute path); and a
successful run prints no kernel or transport warnings.

A notebook's fingerprint covers what it imports (issue 73): the package files its imports reach,
directly or not (``pipeline.synclib_closure`` of ``notebook.synclib_imports``), so an edit under
``synclib/`` re-runs the pages that use the edited module and no other; the claims job re-runs where
the claims' code changed, and with it every page; ``synclib run --pages NAME`` (``make page``)
re-runs the named notebook and the book only.  The fast tests below read the job graph's
fingerprints; the long ones edit a copied repository and run the main job.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from synclib.config import load_config
from synclib.notebook import figure_notebooks, synclib_imports
from synclib.paths import NOTEBOOK_DIR, REPO_ROOT
from synclib.run import pipeline
from test_resume import _env, _finish, _setup

NOTEBOOK = "fig07_topk"


def _started(root: Path, cfg: Path, steps: str | None = None, pages: str | None = None) -> set[str]:
    """Run the main job once more; the jobs it started (not those it found up to date)."""
    log = root / "results" / "tiny" / "run-log.jsonl"
    before = len(log.read_text().splitlines())
    cmd = [sys.executable, "-m", "synclib", "run", "--config", str(cfg)] + (["--steps", steps] if steps else [])
    cmd += ["--pages", pages] if pages else []
    proc = subprocess.run(cmd, cwd=root, env=_env(root), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for noise in ("Kernel is running over TCP", "Parent appears to have exited", "KeyboardInterrupt"):
        assert noise not in proc.stdout + proc.stderr, f"a successful run printed {noise!r}"
    events = [json.loads(line) for line in log.read_text().splitlines()[before:]]
    return {e["job"] for e in events if e["event"] == "started"}


def _seconds(text: str) -> str:
    return re.search(r"failed after (\d+) s", text).group(1)


def _frame(text: str) -> str:
    """The innermost frame the failure line names (pandas' here: the cell's own error)."""
    return re.search(r" -> (\S+:\d+ in \S+); the executed", text).group(1)


def _edit(root: Path, line: str) -> None:
    nb = root / "notebooks" / f"{NOTEBOOK}.md"
    nb.write_text(nb.read_text() + f"\n{line}\n")


def _page(root: Path) -> str:
    return (root / "_build" / "html" / "book" / "executed" / f"{NOTEBOOK}.html").read_text()


@pytest.mark.slow
@pytest.mark.long
def test_an_edited_notebook_reaches_its_page_and_nothing_else_reruns(tiny_models, tmp_path):
    root, cfg = _setup(tmp_path, "student", tiny_models)
    _finish(root, cfg)
    assert _started(root, cfg) == set()  # a second run with nothing changed does nothing

    _edit(root, "A first line a student added.")
    assert _started(root, cfg) == {f"notebook:{NOTEBOOK}", "book"}
    assert "A first line a student added." in _page(root)

    _edit(root, "A second line, rebuilt with the notebook steps only.")
    assert _started(root, cfg, "notebooks,book") == {f"notebook:{NOTEBOOK}", "book"}
    assert "A second line, rebuilt with the notebook steps only." in _page(root)
    assert _started(root, cfg) == set()  # the two routes agree: switching re-runs nothing

    # a mistake: `synclib run` says which notebook, cell and line in two lines, keeps the notebook,
    # logs the traceback and leaves the book as it was
    page = _page(root)
    nb = root / "notebooks" / f"{NOTEBOOK}.md"
    good = nb.read_text()
    nb.write_text(good + "\n```{code-cell}\ntopk.loc[topk['k'] == 99, 'mean'].iloc[0]\n```\n")
    proc = subprocess.run([sys.executable, "-m", "synclib", "run", "--config", str(cfg)], cwd=root, env=_env(root),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1
    kept = root / "results" / "tiny" / "failed" / f"{NOTEBOOK}.ipynb"
    assert proc.stderr.strip().splitlines() == [
        f"[synclib] FAILED: notebook:{NOTEBOOK} failed after {_seconds(proc.stderr)} s: cell In [7] raised "
        "IndexError: single positional indexer is out-of-bounds, at `topk.loc[topk['k'] == 99, 'mean'].iloc[0]`"
        f" -> {_frame(proc.stderr)}; the executed notebook is results/tiny/failed/{NOTEBOOK}.ipynb; the full "
        "traceback is in results/tiny/run-log.jsonl",
        "[synclib] the jobs that finished are kept: fix the cause and run the same command again to resume"]
    assert _frame(proc.stderr).startswith("pandas/core/")  # an installed package's frame, from the package on
    assert "Traceback" not in proc.stdout + proc.stderr and kept.is_file()
    event = json.loads((root / "results" / "tiny" / "run-log.jsonl").read_text().splitlines()[-1])
    assert event["event"] == "failed" and "Traceback (most recent call last)" in event["traceback"]
    assert _page(root) == page  # the book is as it was
    nb.write_text(good)  # back as it was: its page is up to date, and the failed copy goes
    assert _started(root, cfg) == set() and not kept.exists()

    moved = tmp_path / "moved" / "student"
    moved.parent.mkdir()
    shutil.move(str(root), moved)
    moved_cfg = moved / cfg.name
    stamps = list(moved.rglob("*.done.json"))
    assert stamps
    for stamp in stamps:
        text = stamp.read_text()
        assert str(root) not in text and str(tmp_path) not in text, f"{stamp} records an absolute path"
    out = subprocess.run([sys.executable, "-c", "import synclib; print(synclib.__file__)"], cwd=moved,
                         env=_env(moved), capture_output=True, text=True, check=True).stdout
    assert Path(out.strip()).is_relative_to(moved)
    assert _started(moved, moved_cfg) == set()  # a moved checkout re-runs nothing


# --------------------------------------------------------------------------- what a notebook's fingerprint covers
NB_HEAD = ("---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
           "kernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n\n")


def test_a_notebooks_imports_are_its_code_cells_synclib_imports():
    """notebook.synclib_imports: the package's modules a text notebook's code cells (or a module's code)
    import, anywhere in them (in a function too), a name imported from a package that is a module of it
    counted as that module; its Markdown, IPython's magics and other packages are not imports."""
    text = NB_HEAD + (
        "# A page\n\nIt says `from synclib import power` in words.\n\n"
        "```{code-cell}\n%matplotlib inline\nimport numpy as np\nfrom synclib import notebook, theme\n"
        "import synclib.stats\nfrom synclib.analysis.claims import CANNOT\n```\n\n"
        "```{code-cell}\ndef later():\n    from synclib.analysis import tables\n    return tables\n```\n")
    got = synclib_imports(text, REPO_ROOT)
    assert set(got) == {"synclib", "synclib.notebook", "synclib.theme", "synclib.stats", "synclib.analysis.claims",
                        "synclib.analysis", "synclib.analysis.tables"}
    assert "synclib.power" not in got and "synclib.analysis.claims.CANNOT" not in got
    module = "import os\nfrom synclib.paths import REPO_ROOT\n\ndef f():\n    import synclib.stats as s\n    return s\n"
    assert set(synclib_imports(module, REPO_ROOT)) == {"synclib.paths", "synclib.stats"}
    assert set(synclib_imports((NOTEBOOK_DIR / "fig07_topk.md").read_text(), REPO_ROOT)) == \
        {"synclib", "synclib.notebook", "synclib.theme", "synclib.stats"}


def _rel(paths) -> set[str]:
    return {str(p.relative_to(REPO_ROOT)) for p in paths}


def test_the_closure_is_every_package_file_an_import_reaches():
    """pipeline.synclib_closure: the modules' files, their packages' __init__ files, and, closed under
    import, every package file those import at load time or inside a function; nothing else."""
    assert _rel(pipeline.synclib_closure(["synclib.theme"])) == {"synclib/__init__.py", "synclib/theme.py"}
    notebook = pipeline.synclib_closure(["synclib.notebook"])
    assert "synclib/theme.py" in _rel(notebook)  # imported inside the renderer
    tables = _rel(pipeline.synclib_closure(["synclib.analysis.tables"]))
    assert {"synclib/analysis/__init__.py", "synclib/analysis/tables.py", "synclib/stats.py",
            "synclib/tasks/scenarios.py", "synclib/tasks/__init__.py"} <= tables
    for modules in (["synclib.notebook"], ["synclib.analysis.claims"], ["synclib.run.pipeline"]):
        closure = pipeline.synclib_closure(modules)
        for path in closure:  # closed: every import of a file in it resolves to files in it
            for name in synclib_imports(path.read_text(), REPO_ROOT):
                assert pipeline.synclib_closure([name]) <= closure, (modules, path, name)
    # directly or not: the reproduce page prices the paper's grid with the main job's code, which reaches the
    # engine; a figure's page does not
    fig07 = pipeline.synclib_closure(["synclib.notebook", *synclib_imports((NOTEBOOK_DIR / "fig07_topk.md")
                                                                          .read_text(), REPO_ROOT)])
    reproduce = pipeline.synclib_closure(["synclib.notebook", *synclib_imports((NOTEBOOK_DIR / "reproduce.md")
                                                                              .read_text(), REPO_ROOT)])
    assert "synclib/engine/core.py" not in _rel(fig07) and "synclib/engine/core.py" in _rel(reproduce)
    assert pipeline.code_hash(["synclib.theme"]) == pipeline._file_hash(*sorted(
        pipeline.synclib_closure(["synclib.theme"])))


def _rerun_by(monkeypatch, tmp_path, edited: str) -> set[str]:
    """The jobs of the default run whose fingerprint an edit of the repository's file ``edited`` changes
    (those a run would start again), read from the graph with the file's hash changed."""
    cfg = load_config(None, [f"results_dir={tmp_path / 'r'}"])
    before = {k: j.fp for k, j in pipeline.build_jobs(cfg).items()}
    path = REPO_ROOT / edited
    assert path.is_file()
    real = pipeline._file_hash
    monkeypatch.setattr(pipeline, "_file_hash", lambda *paths: real(*paths) + ("+edit" if path in paths else ""))
    after = {k: j.fp for k, j in pipeline.build_jobs(cfg).items()}
    return {k for k in before if before[k] != after[k]}


def _pages(*stems) -> set[str]:
    return {f"notebook:{s}" for s in stems}


EVERY_PAGE = {f"notebook:{nb.stem}" for nb in figure_notebooks()}


@pytest.mark.parametrize("edited, rerun", [
    ("notebooks/fig07_topk.md", _pages("fig07_topk") | {"book"}),
    ("synclib/analysis/tables.py", {"claims", "book"} | EVERY_PAGE),   # the claims' code and every page's
    ("synclib/analysis/claims.py", {"claims", "book"} | EVERY_PAGE),
    ("synclib/judge/backends.py", set()),                               # imported by no page and not by the claims
    ("data/published.json", {"claims", "book"} | EVERY_PAGE)])
def test_an_edit_re_runs_the_jobs_whose_fingerprint_covers_it(monkeypatch, tmp_path, edited, rerun):
    assert _rerun_by(monkeypatch, tmp_path, edited) == rerun


#: the claims job's fingerprint covers ``synclib.analysis.claims``' closure only (not the pipeline's, which
#: reaches the engine and the theme): an edit outside it re-runs only the pages whose imports reach it
@pytest.mark.parametrize("edited, rerun", [
    ("synclib/theme.py", {"book"} | EVERY_PAGE),                        # every page imports it, the claims do not
    ("synclib/engine/core.py", _pages("reproduce") | {"book"})])        # reproduce prices the grid with the engine's
def test_an_edit_re_runs_only_the_pages_that_import_it(monkeypatch, tmp_path, edited, rerun):
    assert _rerun_by(monkeypatch, tmp_path, edited) == rerun


def _edit_docstring(path: Path) -> None:
    text = path.read_text()
    i = text.index('"""') + 3
    path.write_text(text[:i] + "Edited by a test. " + text[i:])


@pytest.fixture(scope="module")
def finished(tiny_models, tmp_path_factory):
    """A copy of the repository with the small run finished (tests/test_resume.py's set-up)."""
    root, cfg = _setup(tmp_path_factory.mktemp("imports"), "imports", tiny_models)
    _finish(root, cfg)
    return root, cfg


def _every_page(root: Path) -> set[str]:
    return {f"notebook:{nb.stem}" for nb in (root / "notebooks").glob("*.md")}


def _html(root: Path, stem: str) -> str:
    return (root / "_build" / "html" / "book" / "executed" / f"{stem}.html").read_text()


@pytest.mark.slow
@pytest.mark.long
def test_an_edit_under_synclib_re_runs_the_pages_that_import_it(finished):
    """In a copied repository: an edit to a module no page and no claim imports re-runs nothing; an edit
    to the tables re-runs the claims and every page; `--pages fig07` (what `make page NAME=fig07` runs)
    re-runs that notebook and the book only, leaving another edited page for the next whole run."""
    root, cfg = finished
    assert _started(root, cfg) == set()
    _edit_docstring(root / "synclib" / "judge" / "backends.py")
    assert _started(root, cfg) == set()
    _edit_docstring(root / "synclib" / "analysis" / "tables.py")
    assert _started(root, cfg) == {"claims", "book"} | _every_page(root)
    for stem, line in (("fig11_tom", "A line on another page."), (NOTEBOOK, "A line on the page being worked on.")):
        nb = root / "notebooks" / f"{stem}.md"
        nb.write_text(nb.read_text() + f"\n{line}\n")
    assert _started(root, cfg, "notebooks,book", pages="fig07") == {f"notebook:{NOTEBOOK}", "book"}
    assert "A line on the page being worked on." in _html(root, NOTEBOOK)
    assert "A line on another page." not in _html(root, "fig11_tom")
    assert _started(root, cfg) == {"notebook:fig11_tom", "book"}
    assert "A line on another page." in _html(root, "fig11_tom")
    assert _started(root, cfg) == set()


@pytest.mark.slow
@pytest.mark.long
def test_an_edit_to_the_theme_or_the_engine_re_runs_only_the_pages_that_import_them(finished):
    """In the same copy: the theme, which every page imports and the claims do not, re-runs every page and
    the book, not the claims; the engine, which only the reproduce page reaches (through the main job's
    price of the paper's grid), re-runs that page and the book."""
    root, cfg = finished
    assert _started(root, cfg) == set()
    _edit_docstring(root / "synclib" / "theme.py")
    assert _started(root, cfg) == {"book"} | _every_page(root)
    _edit_docstring(root / "synclib" / "engine" / "core.py")
    assert _started(root, cfg) == {"notebook:reproduce", "book"}
