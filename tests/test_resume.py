"""The main job survives ``kill -9`` anywhere: a run killed during simulation, judging,
analysis, notebook execution and the book's build, and restarted each time, ends with the results an
uninterrupted run writes, and never redoes a finished job.

Both runs are the same command in a subprocess with the same environment (one BLAS/OpenMP
thread), on tiny random models built from a config, so their numbers are bitwise equal.
Each runs in its own copy of the repository, since the main job also writes the executed
notebooks into the repository.  The run is deliberately
small (one pair of two models in both orders, 3 tasks, 2 seeds, 4 utterances, 2 split
seeds, the optional analyses off): the size a student tries a change with, which must
render every page too.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from conftest import kill9_when

REPO = Path(__file__).resolve().parents[1]
STEPS = "simulate,judge,analyze,notebooks,book"

CONFIG = """
name: tiny
results_dir: results/tiny
scenarios: embedded
device: cpu
dtype: float32
models:
  A: {{spec: {a}, family: Tiny, label: tiny-A}}
  B: {{spec: {b}, family: Other, label: tiny-B}}
pairs: [A-B]
orders: both
simulate: {{episodes: 3, seeds: [0, 1], passive_seeds: [0], max_utterances: 4, max_new_tokens: 6,
            units_per_part: 2, passive: true, tom: true}}
judge: {{model: {a}, mode: constrained, sample: 3}}
analysis: {{alpha: 0.1, n_samples: null, split_seeds: [0, 1], lags: [1], sample_sizes: null,
            persona_disjoint: false, relationship: false, nonlinear: false, tom: true}}
notebooks: {{ability_scores: null}}
"""


def _copy_repo(dst: Path) -> Path:
    skip = shutil.ignore_patterns(".venv", ".git", "results", "_build", "executed", "_generated", "__pycache__",
                                  ".pytest_cache", "*.egg-info", ".whl")
    shutil.copytree(REPO, dst, ignore=skip)
    return dst


def _env(root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONHASHSEED": "0"}
    env.pop("CI", None)
    return env


def _start(root: Path, cfg: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "synclib", "run", "--config", str(cfg), "--steps", STEPS],
                            cwd=root, env=_env(root), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _finish(root: Path, cfg: Path) -> None:
    proc = _start(root, cfg)
    _, err = proc.communicate(timeout=1500)
    assert proc.returncode == 0, err.decode()[-4000:]


def _setup(tmp: Path, name: str, models) -> tuple[Path, Path]:
    root = _copy_repo(tmp / name)
    cfg = root / "tiny.yaml"
    cfg.write_text(CONFIG.format(a=models[0], b=models[1]))
    out = subprocess.run([sys.executable, "-c", "import synclib; print(synclib.__file__)"], cwd=root,
                         env=_env(root), capture_output=True, text=True, check=True).stdout
    assert Path(out.strip()).is_relative_to(root), "the copy's synclib must be the one imported"
    return root, cfg


def _any(pattern_dir: Path, pattern: str, nonempty: bool = False):
    def ready():
        return any((not nonempty) or p.stat().st_size > 0 for p in pattern_dir.glob(pattern))
    return ready


def _markdown_outputs(nb: Path) -> list[str]:
    cells = json.loads(nb.read_text())["cells"]
    return [o["data"]["text/markdown"] if isinstance(o["data"]["text/markdown"], str)
            else "".join(o["data"]["text/markdown"])
            for c in cells for o in c.get("outputs", []) if "text/markdown" in o.get("data", {})]


@pytest.mark.slow
@pytest.mark.long
def test_kill9_in_every_step_then_resume_equals_uninterrupted(tiny_models, tmp_path):
    clean, clean_cfg = _setup(tmp_path, "clean", tiny_models)
    _finish(clean, clean_cfg)

    root, cfg = _setup(tmp_path, "killed", tiny_models)
    R = root / "results" / "tiny"
    kill_points = [  # (step, ready-to-kill predicate): each restart resumes and is killed further on
        ("simulate", _any(R / "cubes", "*.nc.parts/part-*.nc")),
        ("judge", _any(R / "cubes", "*.judge-cache.jsonl", nonempty=True)),
        ("analyze", _any(R / "analysis", "*.nc")),
        ("notebooks", _any(root / "book" / "executed", "*.ipynb")),
        ("book", lambda: (root / "_build").is_dir()),
    ]
    for step, ready in kill_points:
        kill9_when(_start(root, cfg), ready, timeout=900)
    _finish(root, cfg)

    C = clean / "results" / "tiny"
    runs = ["A-B", "B-A"]
    for run in runs:
        a = xr.load_dataset(C / "cubes" / f"{run}.nc")
        b = xr.load_dataset(R / "cubes" / f"{run}.nc")
        assert set(a.data_vars) == set(b.data_vars)
        for v in a.data_vars:  # bitwise, texts included
            np.testing.assert_array_equal(a[v].values, b[v].values, err_msg=f"{run} {v}")
        assert (C / "judge" / f"{run}.judge.csv").read_bytes() == (R / "judge" / f"{run}.judge.csv").read_bytes()
        xa = xr.load_dataset(C / "analysis" / f"{run}.nc")
        xb = xr.load_dataset(R / "analysis" / f"{run}.nc")
        for v in xa.data_vars:
            np.testing.assert_array_equal(xa[v].values, xb[v].values, err_msg=f"{run} analysis {v}")
    # every page rendered and says the same (but for when the run was made: the first page's run table)
    executed = sorted(p.name for p in (clean / "book" / "executed").glob("*.ipynb"))
    assert executed == sorted(p.name for p in (root / "book" / "executed").glob("*.ipynb"))
    assert len(executed) == len(list((REPO / "notebooks").glob("*.md")))

    def said(r, name):
        return [re.sub(r", created [^)]*", "", text) for text in _markdown_outputs(r / "book" / "executed" / name)]
    for name in executed:
        assert said(clean, name) == said(root, name), name
    assert any(text.startswith("**Run `tiny`**") for text in said(root, "intro.ipynb"))
    assert (C / "claims.json").read_bytes() == (R / "claims.json").read_bytes()
    # the book: every page built
    def pages(r):
        return sorted(str(p.relative_to(r)) for p in (r / "_build" / "html").rglob("*.html"))
    assert pages(clean) == pages(root) and (root / "_build" / "html" / "index.html").is_file()
    # no job that had finished was started again
    events = [json.loads(line) for line in (R / "run-log.jsonl").read_text().splitlines()]
    finished = set()
    for e in events:
        if e["event"] == "started":
            assert e["job"] not in finished, f"{e['job']} was redone after it finished"
        elif e["event"] == "finished":
            finished.add(e["job"])
    assert {e["job"] for e in events if e["event"] == "started"} >= {f"simulate:{r}" for r in runs}
