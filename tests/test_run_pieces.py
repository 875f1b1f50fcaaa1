"""A grid run in pieces (issue 62, item 3): ``synclib run --runs`` plays chosen ordered runs
whose stamps the whole config accepts, a stale finished cube is set aside (never deleted), one
process at a time makes an output, and the notebooks and the book are built only once every
run's results are in.

The grids are tiny config-built models on the embedded tasks (``conftest.grid_config``); the
pieces run through the real ``synclib run`` command line, in this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr

from conftest import REPO, grid_config
from synclib import cli
from synclib.config import load_config
from synclib.run import pipeline
from synclib.stamps import output_lock, read_stamp

STEPS = "simulate,judge,analyze"


def _write(cfg: dict, path: Path) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    return path


def _log(results: Path) -> list[dict]:
    f = results / "run-log.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


# --------------------------------------------------------------------------- choosing runs
def test_runs_are_chosen_by_name_or_position_and_a_wrong_one_is_named(capsys):
    cfg = load_config(REPO / "config" / "paper.yaml")
    names = [r.name for r in pipeline.runs(cfg)]
    assert cli.main(["run", "--config", str(REPO / "config" / "paper.yaml"), "--list-runs"]) == 0
    assert capsys.readouterr().out.split() == [x for i, n in enumerate(names) for x in (str(i), n)]
    assert [r.name for r in pipeline.select_runs(cfg, ["L2-M1", "0", "L2-M1"])] == [names[0], "L2-M1"]
    for bad, says in (("L2-M9", "did you mean 'L2-M"), ("36", "out of range: the config has 36 ordered runs")):
        assert cli.main(["run", "--config", str(REPO / "config" / "paper.yaml"), "--runs", bad, "--dry-run"]) == 2
        assert says in capsys.readouterr().err
    jobs = pipeline.build_jobs(cfg, pipeline.STEPS, ["L2-M1"])
    assert sorted(jobs) == ["analyze:L2-M1", "judge:L2-M1", "simulate:L2-M1"]  # no notebooks, no book


@pytest.mark.long  # the paper's whole grid of jobs built twice (about 15 s): CI runs it
def test_a_runs_fingerprints_do_not_depend_on_the_rest_of_the_grid():
    """A job's fingerprint holds only what changes its output: the run of a one-pair config in
    one order is the whole grid's run (before, `orders` and `pairs` made it stale)."""
    full = load_config(REPO / "config" / "paper.yaml")
    alone = load_config(REPO / "config" / "paper.yaml", ["pairs=[L2-M1]", "orders=first"])
    a, b = pipeline.build_jobs(full, ("simulate", "judge", "analyze")), pipeline.build_jobs(alone, ("simulate", "judge",
                                                                                                     "analyze"))
    for step in ("simulate", "judge", "analyze"):
        assert a[f"{step}:L2-M1"].fp == b[f"{step}:L2-M1"].fp, step
    other = load_config(REPO / "config" / "paper.yaml", ["simulate.temperature=0.5"])
    assert pipeline.build_jobs(other, ("simulate",))["simulate:L2-M1"].fp != a["simulate:L2-M1"].fp
    # the judge's endpoint moves with each serving job (http://NODE:8000/v1): what it answers does not
    moved = load_config(REPO / "config" / "paper.yaml", ["judge.url=http://gpu042:8000/v1"])
    assert pipeline.build_jobs(moved, ("judge",))["judge:L2-M1"].fp == a["judge:L2-M1"].fp
    other_judge = load_config(REPO / "config" / "paper.yaml", ["judge.model=openai/gpt-oss-20b"])
    assert pipeline.build_jobs(other_judge, ("judge",))["judge:L2-M1"].fp != a["judge:L2-M1"].fp


@pytest.fixture(scope="module")
def pieces(tmp_path_factory, two_models):
    """The two-run grid played as two `--runs` commands (as two array tasks would)."""
    root = tmp_path_factory.mktemp("pieces")
    cfg = grid_config(root / "r", two_models, episodes=4)
    conf = _write(json.loads(json.dumps({k: v for k, v in cfg.items()})), root / "grid.yaml")
    for run in ("T-T", "1"):  # a name, then a position (as an array task's id)
        assert cli.main(["run", "--config", str(conf), "--runs", run, "--steps", STEPS, "--in-process"]) == 0
    return conf, root / "r"


def test_runs_played_apart_are_the_grids_runs(pieces, capsys):
    """After the pieces the whole config finds every simulation, judge and analysis up to date;
    the manifest, the notebooks and the book are what is left."""
    conf, results = pieces
    cfg = load_config(conf)
    rows = {r.key: r.status for r in pipeline_plan(cfg)}
    assert {k: v for k, v in rows.items() if k.split(":")[0] in ("simulate", "judge", "analyze")} == \
        {f"{s}:{r}": "up to date" for s in ("simulate", "judge", "analyze") for r in ("T-T", "T-U")}
    assert all(v == "will run" for k, v in rows.items() if k.split(":")[0] in ("manifest", "notebook", "pages", "book"))
    for run in ("T-T", "T-U"):
        assert (results / "cubes" / f"{run}.nc").exists() and (results / "analysis" / f"{run}.nc").exists()


def pipeline_plan(cfg):
    from synclib.run.plan import plan

    return plan(pipeline.build_jobs(cfg), cfg)


def test_the_book_waits_for_every_run_and_simulates_nothing(tmp_path, two_models, capsys):
    """`--steps notebooks,book` before the runs are in: refused, naming the jobs that are not
    done, nothing written (on a login node it must never start a simulation)."""
    cfg = grid_config(tmp_path / "r", two_models, episodes=4)
    conf = _write(cfg, tmp_path / "grid.yaml")
    assert cli.main(["run", "--config", str(conf), "--steps", "notebooks,book", "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert "MISS simulate:T-T" in captured.out and "the run would refuse to start" in captured.out
    assert cli.main(["run", "--config", str(conf), "--steps", "notebooks,book"]) == 2
    err = capsys.readouterr().err
    assert "6 job(s) of step(s) not in --steps notebooks,book are not done: simulate:T-T, judge:T-T" in err
    assert "nothing was started" in err and not (tmp_path / "r").exists()


def test_a_stale_cube_and_stale_parts_are_set_aside_never_deleted(pieces, tmp_path, capsys):
    """The settings of a finished run change: its cube goes to RUN.stale-*.nc with its stamp and
    a log line, and the run plays again; the parts of an unfinished run made with other
    settings likewise."""
    import shutil

    conf, results = pieces
    moved = tmp_path / "r"
    shutil.copytree(results, moved)
    cfg = load_config(conf, [f"results_dir={moved}"])
    cube = moved / "cubes" / "T-T.nc"
    before = read_stamp(cube)["fingerprint"]
    parts = moved / "cubes" / "T-U.nc.parts"
    (moved / "cubes" / "T-U.nc").unlink()  # T-U unfinished, with parts of another run's settings
    parts.mkdir()
    (parts / "spec.json").write_text(json.dumps({"episodes": [], "attrs": {"temperature": 9.0}}))
    over = [f"results_dir={moved}", "simulate.max_new_tokens=4"]
    assert cli.main(["run", "--config", str(conf), *sum((["--set", o] for o in over), []), "--steps", "simulate",
                     "--in-process"]) == 0
    out = capsys.readouterr().out
    stale = sorted((moved / "cubes").glob("T-T.stale-*.nc"))
    assert len(stale) == 1 and read_stamp(stale[0])["fingerprint"] == before
    assert xr.open_dataset(stale[0]).attrs["max_new_tokens"] == 5
    assert xr.open_dataset(cube).attrs["max_new_tokens"] == 4
    assert len(list((moved / "cubes").glob("T-U.stale-*.nc.parts"))) == 1 and not parts.exists()
    assert "set aside as" in out
    events = [e for e in _log(moved) if e["event"] == "set aside"]
    assert {e["job"] for e in events} == {"simulate:T-T", "simulate:T-U"}
    assert all(Path(REPO / e["to"]).exists() or Path(e["to"]).exists() for e in events)
    assert cfg["results_dir"] == str(moved)


def test_one_process_at_a_time_makes_an_output(tmp_path):
    """A second process that wants the same output waits, naming the holder, until the first
    lets go (a stopped worker that lives on, two array tasks for one run)."""
    out = tmp_path / "cubes" / "A-B.nc"
    code = ("import sys, time; from pathlib import Path; from synclib.stamps import output_lock; "
            f"t = time.time()\nwith output_lock(Path({str(out)!r})): print('got it after', round(time.time() - t, 1))")
    with output_lock(out, say=lambda line: None):
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        time.sleep(2.0)
        assert proc.poll() is None  # still waiting
    text, _ = proc.communicate(timeout=60)
    assert f"pid {os.getpid()}, which still writes A-B.nc" in text
    assert float(text.split("got it after")[1]) >= 1.5
