"""The grid on a real SLURM scheduler (issue 62, item 1): one node on this machine, started by
``tools/slurm-local`` (Debian's slurmctld, slurmd and munge; no cgroups, two count-only GPUs).

Opt-in: ``SYNCLIB_TEST_SLURM=1`` (``.ci/run`` sets it and installs the packages where they are
missing); otherwise, or where the machine cannot start SLURM, every test here skips, saying why.

A small grid (two ordered runs of tiny config-built models, the embedded tasks, greedy
decoding) runs three ways and must give the same cubes, judge tables and analyses as the same
grid run in this process:

1. ``synclib run`` with ``cluster: {type: slurm, ...}``: dask-jobqueue submits worker jobs
   (``--gres=gpu:1``, one worker process each, resource GPU=1) and the grid runs on them;
2. the same, with the job that runs a simulation cancelled (``scancel``) once its cube has a
   part on disk: the cluster submits a replacement job, and the simulation resumes from the
   parts (the run's log says so);
3. ``config/slurm/runs.sbatch`` as a job array, one ordered run per task, then the book's
   steps refuse nothing that is missing (every run's jobs are up to date for the config).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, assert_same_results, grid_config, grid_results
from synclib.run import pipeline

SCRIPT = REPO / "tools" / "slurm-local"
STEPS = ("simulate", "judge", "analyze")
RUNS = ("T-T", "T-U")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running one-node SLURM (``SLURM_CONF`` set for this process and its children)."""
    if not os.environ.get("SYNCLIB_TEST_SLURM"):
        pytest.skip("the SLURM tests are opt-in: SYNCLIB_TEST_SLURM=1 (CI sets it; tools/slurm-local starts SLURM)")
    # munged wants every folder above its socket open to all: not pytest's private tmp folders
    state = os.environ.get("SYNCLIB_SLURM_DIR") or "/tmp/synclib-slurm"
    out = subprocess.run([str(SCRIPT), "start", state], capture_output=True, text=True, timeout=120)
    if out.returncode:
        pytest.skip(f"SLURM cannot start on this machine: {out.stderr.strip().splitlines()[-1]}")
    conf = out.stdout.strip().split("=", 1)[1].strip().strip("'\"")
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield {"conf": conf, "dir": state}
    subprocess.run([str(SCRIPT), "stop", state], capture_output=True, text=True, timeout=120)
    if before is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = before


def _config(results: Path, models, logs: Path, **cluster) -> dict:
    """The small grid (device auto: its simulations and judge hold a GPU each) with a SLURM
    cluster of two one-core jobs on the local node."""
    cfg = grid_config(results, models, episodes=12, device="auto", dtype="float32",
                      simulate={"units_per_part": 1})
    cfg["cluster"] = {"type": "slurm", "jobs": 2, "cores": 1, "memory": "3GB", "walltime": "00:30:00",
                      "queue": "debug", "interface": "lo", "log_directory": str(logs),
                      "scheduler_options": {"dashboard_address": None}, **cluster}
    return cfg


def _write(cfg: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(json.loads(json.dumps(cfg))))
    return path


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, two_models):
    """The grid run in this process, with one thread as a dask worker computes."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("slurm-reference")
        cfg = _config(root / "r", two_models, root / "logs")
        cfg.pop("cluster")
        pipeline.execute(pipeline.build_jobs(cfg, STEPS), isolate=False)  # here, with this one thread
    finally:
        torch.set_num_threads(threads)
    return grid_results(root / "r")


def _squeue() -> dict[str, str]:
    """``{job id: state}`` of the cluster's jobs."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, timeout=30).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def _run(conf: Path, *extra, timeout=900) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "synclib", "run", "--config", str(conf),
                             "--steps", ",".join(STEPS), *extra], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _events(results: Path) -> list[dict]:
    return [json.loads(line) for line in (results / "run-log.jsonl").read_text().splitlines()]


def test_the_grid_runs_as_slurm_jobs_and_gives_the_in_process_results(slurm, tmp_path, two_models, in_process):
    cfg = _config(tmp_path / "r", two_models, tmp_path / "logs")
    conf = _write(cfg, tmp_path / "grid.yaml")
    jobs: set[str] = set()
    proc = _run(conf)
    while proc.poll() is None:
        jobs |= set(_squeue())
        time.sleep(0.5)
    out = proc.stdout.read()
    assert proc.returncode == 0, out
    assert len(jobs) >= 1, "no SLURM job was submitted"
    scripts = [p.read_text() for p in sorted((tmp_path / "logs").glob("*.err"))] + \
        [p.read_text() for p in sorted((tmp_path / "logs").glob("*.out"))]
    assert scripts, "the worker jobs wrote no logs"
    print(f"SLURM jobs submitted: {sorted(jobs, key=int)}")
    assert_same_results(grid_results(tmp_path / "r"), in_process)


def _job_of(pid: int) -> str | None:
    """The SLURM job whose processes include ``pid``."""
    for job in _squeue():
        listed = subprocess.run(["scontrol", "listpids", job], capture_output=True, text=True, timeout=30).stdout
        if re.search(rf"^\s*{pid}\s", listed, flags=re.M):
            return job
    return None


def test_a_cancelled_worker_job_is_replaced_and_its_cube_resumes_from_its_parts(slurm, tmp_path, two_models,
                                                                                 in_process):
    cfg = _config(tmp_path / "r", two_models, tmp_path / "logs")
    conf = _write(cfg, tmp_path / "grid.yaml")
    results = tmp_path / "r"
    seen: set[str] = set()
    cancelled: list[tuple[str, str]] = []

    def assassin(proc):
        """Once a cube has a part on disk, cancel the job whose worker writes it."""
        while proc.poll() is None and not cancelled:
            seen.update(_squeue())
            for run in RUNS:
                parts = results / "cubes" / f"{run}.nc.parts"
                lock = results / "cubes" / f"{run}.nc.lock"
                if parts.is_dir() and list(parts.glob("part-*.nc")) and lock.exists():
                    holder = lock.read_text().split()
                    job = _job_of(int(holder[-1])) if len(holder) >= 3 else None
                    if job and not (results / "cubes" / f"{run}.nc").exists():
                        subprocess.run(["scancel", job], check=True, timeout=30)
                        cancelled.append((job, run))
                        return
            time.sleep(0.1)

    proc = _run(conf)
    t = threading.Thread(target=assassin, args=(proc,), daemon=True)
    t.start()
    while proc.poll() is None:
        seen.update(_squeue())
        time.sleep(0.5)
    t.join(timeout=10)
    out = proc.stdout.read()
    assert proc.returncode == 0, out
    assert cancelled, f"no job was cancelled mid-simulation (the test did not exercise a failure):\n{out}"
    job, run = cancelled[0]
    assert len(seen) > 2, f"no replacement job was submitted: {sorted(seen)}"
    resumed = [e for e in _events(results) if e["job"] == f"simulate:{run}" and e["event"] == "resuming"]
    assert resumed and resumed[0]["parts"] >= 1, _events(results)
    print(f"SLURM jobs: {sorted(seen, key=int)}; cancelled job {job} while it simulated {run}; "
          f"resumed from {resumed[0]['parts']} part(s)")
    assert not (results / "cubes" / f"{run}.nc.parts").exists()
    assert_same_results(grid_results(results), in_process)


def test_the_array_template_runs_one_ordered_run_per_task(slurm, tmp_path, two_models, in_process, capsys):
    """config/slurm/runs.sbatch as the reproduce page submits it (resources cut to this node),
    then the whole config finds every run's jobs done: the book's steps would start."""
    cfg = _config(tmp_path / "r", two_models, tmp_path / "logs")
    cfg.pop("cluster")
    conf = _write(cfg, tmp_path / "grid.yaml")
    listed = subprocess.run([sys.executable, "-m", "synclib", "run", "--config", str(conf), "--list-runs"],
                            cwd=REPO, capture_output=True, text=True, timeout=120, check=True).stdout.split("\n")
    n = len([line for line in listed if line.strip()])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SYNCLIB_STEPS": "simulate,judge,analyze",
           "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    sub = subprocess.run(["sbatch", "--wait", f"--array=0-{n - 1}", "--mem=2G", "--cpus-per-task=1",
                          "--time=00:20:00", f"--output={tmp_path}/%x-%A_%a.out", "--partition=debug",
                          str(REPO / "config" / "slurm" / "runs.sbatch"), str(conf)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("synclib-run-*.out")))
    assert sub.returncode == 0, sub.stdout + sub.stderr + logs
    assert len(list(tmp_path.glob("synclib-run-*.out"))) == n == 2
    assert_same_results(grid_results(tmp_path / "r"), in_process)
    from synclib.config import load_config

    jobs = pipeline.build_jobs(load_config(conf))
    assert not pipeline.not_done(jobs) and all(jobs[f"{s}:{r}"].done() for s in STEPS for r in RUNS)
