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

import pytest

from conftest import assert_same_results, grid_config, grid_results
from synclib.run import pipeline

distributed = pytest.importorskip("dask.distributed")

STEPS = ("simulate", "judge", "analyze")


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
    return grid_results(root)


def _cluster():
    return distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                    host="127.0.0.1", dashboard_address=None,
                                    resources={"GPU": 1}, silence_logs=40)


@pytest.mark.slow
@pytest.mark.long
def test_local_cluster_gives_the_in_process_results(tmp_path, two_models, in_process):
    cfg = grid_config(tmp_path, two_models)
    with _cluster() as cluster:
        outputs = pipeline.execute(pipeline.build_jobs(cfg, STEPS), scheduler=cluster.scheduler_address)
    assert all(Path(p).exists() for p in outputs.values())
    assert_same_results(grid_results(tmp_path), in_process)


@pytest.mark.slow
@pytest.mark.long
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
    assert_same_results(grid_results(tmp_path), in_process)


@pytest.mark.long  # the cluster path (about 11 s): CI runs it
def test_gpu_jobs_ask_for_a_gpu_resource(tmp_path, two_models):
    """Simulation and a local judge hold a GPU where the models may compute on one (device auto
    or cuda); analysis only where it fits on the GPU (device cuda); a CPU run holds none."""
    cpu = pipeline.build_jobs(grid_config(tmp_path, two_models), STEPS)
    assert not any(job.gpu for job in cpu.values())
    cfg = grid_config(tmp_path, two_models, device="auto")
    jobs = pipeline.build_jobs(cfg, STEPS)
    assert jobs["simulate:T-T"].gpu and jobs["judge:T-T"].gpu and not jobs["analyze:T-T"].gpu
    cfg_http = grid_config(tmp_path, two_models, device="auto")
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
