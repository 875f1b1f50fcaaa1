"""A student's loop: edit a notebook, rebuild the book, see the change, and nothing else re-run.

On a small run of two tiny random models (the set-up of ``tests/test_resume.py``) in a copy of
the repository: a line added to a figure's notebook reaches its rendered page through the main
job (what ``make book CONFIG=...`` runs) and through ``--steps notebooks,book``, each time
re-running only that notebook and the book; switching between the two routes re-runs nothing;
a mistake in a notebook stops the run with two lines (the notebook, the cell, its line, where
the executed copy and the traceback are) and the same command resumes once it is fixed; a
checkout moved to another folder keeps every stamp (none records an absolute path); and a
successful run prints no kernel or transport warnings.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_resume import _env, _finish, _setup

NOTEBOOK = "fig07_topk"


def _started(root: Path, cfg: Path, steps: str | None = None) -> set[str]:
    """Run the main job once more; the jobs it started (not those it found up to date)."""
    log = root / "results" / "tiny" / "run-log.jsonl"
    before = len(log.read_text().splitlines())
    cmd = [sys.executable, "-m", "synclib", "run", "--config", str(cfg)] + (["--steps", steps] if steps else [])
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
