"""The run graph on a real dask.distributed cluster (issue: scale out through Dask).

A small grid of two model pairs (tiny config-built Llamas, our embedded scenarios) goes
through simulate -> judge -> analyze, once in-process and once on a LocalCluster of two
worker processes on 127.0.0.1; the results must be the same.  A second run kills the
worker that is simulating, mid-job, with SIGKILL: the run must still complete, and with
the same results, because the job is rescheduled and resumes its cube from the parts.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import xarray as xr

from synclib.run import pipeline

distributed = pytest.importorskip("dask.distributed")

STEPS = ("simulate", "judge", "analyze")


@pytest.fixture(scope="module")
def two_models(tmp_path_factory, smollm2_tokenizer):
    from conftest import build_tiny_llama

    root = tmp_path_factory.mktemp("cluster-models")
    return (str(build_tiny_llama(root / "t4", smollm2_tokenizer, layers=4, width=64, seed=0)),
            str(build_tiny_llama(root / "t3", smollm2_tokenizer, layers=3, width=48, seed=1)))


def grid_config(results_dir: Path, models, episodes: int = 6) -> dict:
    cfg = {
        "name": "cluster-test",
        "results_dir": str(results_dir),
        "scenarios": "embedded",
        "device": "cpu",
        "models": {"T": {"spec": models[0], "family": "Tiny"}, "U": {"spec": models[1], "family": "Tiny"}},
        "pairs": ["T-T", "T-U"],
        "orders": "first",  # the executors are compared; one order is enough
        # greedy decoding: the comparison is about the executor, not about sampling
        "simulate": {"episodes": episodes, "seeds": [0], "max_utterances": 6, "max_new_tokens": 5,
                     "temperature": 0.0, "units_per_part": 2, "passive": True, "tom": False},
        "judge": {"model": models[0], "mode": "constrained"},
        "analysis": {"alpha": 0.1, "n_samples": None, "split_seeds": [0, 1], "lags": [1],
                     "persona_disjoint": False, "relationship": False, "sample_sizes": None,
                     "nonlinear": False, "tom": False},
    }
    from synclib.config import validate_config

    return validate_config(cfg)


def collect(results_dir: Path) -> dict:
    out = {}
    for pair in ("T-T", "T-U"):
        with xr.open_dataset(results_dir / "cubes" / f"{pair}.nc") as cube:
            out[f"cube:{pair}"] = cube[["hidden_a", "hidden_b", "hidden_a_passive", "text_a", "text_b"]].load()
        with xr.open_dataset(results_dir / "analysis" / f"{pair}.nc") as res:
            out[f"analysis:{pair}"] = res[["r2", "sync_r2"]].load()
        table = pd.read_csv(results_dir / "judge" / f"{pair}.judge.csv")
        out[f"judge:{pair}"] = table[["episode", "sim_seed", "agent", "dimension", "score"]]
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if key.startswith("judge:"):
            pd.testing.assert_frame_equal(a[key], b[key])
        else:
            xr.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, two_models):
    import torch

    # dask's worker processes run with one thread (OMP_NUM_THREADS=1); so does this run,
    # so that both do the same float arithmetic
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("in-process")
        cfg = grid_config(root, two_models)
        outputs = pipeline.execute(pipeline.build_jobs(cfg, STEPS))
    finally:
        torch.set_num_threads(threads)
    assert set(outputs) == {f"{s}:{p}" for s in STEPS for p in ("T-T", "T-U")}
    return collect(root)


def _cluster():
    return distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                    host="127.0.0.1", dashboard_address=None,
                                    resources={"GPU": 1}, silence_logs=40)


@pytest.mark.slow
def test_local_cluster_gives_the_in_process_results(tmp_path, two_models, in_process):
    cfg = grid_config(tmp_path, two_models)
    with _cluster() as cluster:
        outputs = pipeline.execute(pipeline.build_jobs(cfg, STEPS), scheduler=cluster.scheduler_address)
    assert all(Path(p).exists() for p in outputs.values())
    assert_same(collect(tmp_path), in_process)


@pytest.mark.slow
def test_killed_worker_mid_simulation_still_completes_the_same(tmp_path, two_models, in_process):
    cfg = grid_config(tmp_path, two_models)
    parts = [tmp_path / "cubes" / f"{p}.nc.parts" for p in ("T-T", "T-U")]
    killed = []

    with _cluster() as cluster, distributed.Client(cluster.scheduler_address) as client:
        pids = client.run(os.getpid)

        def assassin():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not killed:
                # a simulation has written at least one part and is still running
                if any(list(d.glob("part-*.nc")) for d in parts if d.exists()):
                    for addr, keys in client.processing().items():
                        if any(str(k).startswith("simulate:") for k in keys) and addr in pids:
                            os.kill(pids[addr], signal.SIGKILL)
                            killed.append(addr)
                            return
                time.sleep(0.02)

        t = threading.Thread(target=assassin, daemon=True)
        t.start()
        outputs = pipeline.execute(pipeline.build_jobs(cfg, STEPS), scheduler=cluster.scheduler_address)
        t.join(timeout=5)
    assert killed, "no worker was killed mid-simulation (the test did not exercise a failure)"
    assert all(Path(p).exists() for p in outputs.values())
    assert not any(d.exists() for d in parts), "parts are consolidated into the finished cube"
    assert_same(collect(tmp_path), in_process)


def test_gpu_jobs_ask_for_a_gpu_resource(tmp_path, two_models):
    """Simulation and a local judge hold a GPU; analysis only where it fits on the GPU (device cuda)."""
    cfg = grid_config(tmp_path, two_models)
    jobs = pipeline.build_jobs(cfg, STEPS)
    assert jobs["simulate:T-T"].gpu and jobs["judge:T-T"].gpu and not jobs["analyze:T-T"].gpu
    cfg_http = grid_config(tmp_path, two_models)
    cfg_http["judge"]["url"] = "http://127.0.0.1:9/v1"
    assert not pipeline.build_jobs(cfg_http, STEPS)["judge:T-T"].gpu
    # the annotation reaches the graph that a distributed scheduler receives
    nodes = pipeline.to_delayed(jobs, distributed=True)

    def resources(key):
        layer = nodes[key].__dask_graph__().layers[key]
        return (layer.annotations or {}).get("resources")

    assert resources("simulate:T-T") == {"GPU": 1}
    assert resources("judge:T-U") == {"GPU": 1}
    assert resources("analyze:T-T") is None
    cfg_cuda = {**grid_config(tmp_path, two_models), "device": "cuda"}
    assert pipeline.build_jobs(cfg_cuda, STEPS)["analyze:T-T"].gpu
    # in-process runs carry no resource annotations (the sync scheduler has no workers)
    local = pipeline.to_delayed(jobs, distributed=False)
    assert local["simulate:T-T"].__dask_graph__().layers["simulate:T-T"].annotations in (None, {})
