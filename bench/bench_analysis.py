"""Benchmark: analysing a paper-scale cube streamed from disk (issue 7).

Writes a cube of the paper's shape through ``synclib.cube.CubeWriter`` (450
tasks x 3 seeds x 8 rounds, two agents of 32 layers x 4096, float32; about 5.6 GB
per hidden-state variable in memory), never holding it whole, then runs
``synclib.analysis.analyze`` on the lazily opened cube in a fresh process and
records the peak resident memory (``ru_maxrss``) and the wall time.

The states are synthetic: a shared 16-dimensional AR(1) latent path per episode,
read out by a fixed random map per layer, plus unit noise; each episode stops
after 8 to 16 utterances (the rest is NaN, as in a simulated cube).  Only the
shapes and the I/O matter here; the SyncR^2 values are not the paper's.

Analysis measured (one fit, CPU float32): the genuine A->B grid, 6,500 samples,
split seed 0, the paper's alpha = 0.1.  The resident-memory budget is the default
(2 GiB), so both variables stream: each fit reads only the rows of its split.

    python bench/bench_analysis.py                        # paper scale (~12 GB on disk, ~15 min)
    python bench/bench_analysis.py --episodes 40 --dim 256 --n-samples 600 --max-resident-gib 0  # quick

Needs numpy, xarray, dask, netCDF4, torch and synclib.  Writes
``bench/results/analysis_stream_cpu.json`` (the quick check writes ``..._small.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from synclib.cube import CubeSpec, CubeWriter, Unit  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
LATENT = 16


def episodes(n):
    return [{"task_index": i, "env_id": f"env{i}", "codename": f"c{i}", "source": "synthetic",
             "relationship": i % 6, "agent1_id": f"p{i % 40}", "agent2_id": f"p{(i * 7 + 1) % 40}",
             "agent1_name": "A", "agent2_name": "B"} for i in range(n)]


def write_cube(path: Path, n_ep, n_seeds, n_rounds, n_layers, dim, units_per_part=25):
    spec = CubeSpec(episodes=episodes(n_ep), seeds=list(range(n_seeds)), n_rounds=n_rounds,
                    n_layers_a=n_layers, d_model_a=dim, n_layers_b=n_layers, d_model_b=dim,
                    attrs={"model_a": "bench-a", "model_b": "bench-b"})
    maps = np.random.default_rng(0).standard_normal((2, n_layers, LATENT, dim), dtype=np.float32)
    w = CubeWriter(path, spec, overwrite=True)
    units = spec.units()
    t0 = time.perf_counter()
    for p in range(0, len(units), units_per_part):
        batch = []
        for e, s in units[p:p + units_per_part]:
            rng = np.random.default_rng([e, s])
            n_utt = int(rng.integers(n_rounds, 2 * n_rounds + 1))
            z = np.zeros((2 * n_rounds, LATENT), dtype=np.float32)
            z[0] = rng.standard_normal(LATENT)
            for t in range(1, 2 * n_rounds):
                z[t] = 0.8 * z[t - 1] + 0.6 * rng.standard_normal(LATENT)
            u = Unit.empty(spec, e, s)
            for who, first in ((0, 0), (1, 1)):
                h = np.einsum("rk,lkd->rld", z[first::2], maps[who])
                h += rng.standard_normal(h.shape, dtype=np.float32)
                h[np.arange(n_rounds) * 2 + first >= n_utt] = np.nan
                u.values["hidden_a" if who == 0 else "hidden_b"] = h
            u.values["n_utterances"] = np.int32(n_utt)
            batch.append(u)
        w.write_part(p // units_per_part, batch)
        print(f"\rparts: {min(p + units_per_part, len(units))}/{len(units)} units", end="", file=sys.stderr)
    t_parts = time.perf_counter() - t0
    t0 = time.perf_counter()
    w.finalize()
    print(file=sys.stderr)
    return {"write_parts_s": round(t_parts, 1), "finalize_s": round(time.perf_counter() - t0, 1)}


def child(path: str, n_samples: int, budget: int) -> None:
    """Runs in a fresh process: analyse and print JSON with time and peak memory."""
    import torch

    from synclib.analysis import analyze
    from synclib.cube import HiddenRows, open_cube

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cube = open_cube(path)
    t0 = time.perf_counter()
    rows = HiddenRows(cube.hidden_a, budget)
    ok = rows.ok  # the finiteness mask, reduced chunk by chunk
    t_mask = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = analyze(cube, conditions=("genuine",), directions=("A->B",), split_seeds=(0,),
                  n_samples=n_samples, alpha=0.1, max_resident_bytes=budget, progress=True)
    t_fit = time.perf_counter() - t0
    print(json.dumps({
        "mask_seconds": round(t_mask, 1), "rows_finite": int(ok.sum()),
        "analyze_seconds": round(t_fit, 1), "peak_rss_gib": round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "rss_after_imports_gib": round(base / 2**20, 2),
        "n_train": int(res.n_train.item()), "n_test": int(res.n_test.item()),
        "sync_r2": round(float(res.sync_r2.item()), 4),
        "streamed": not rows.resident, "max_resident_bytes": budget, "torch_threads": torch.get_num_threads(),
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=450)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--n-samples", type=int, default=6500)
    ap.add_argument("--max-resident-gib", type=float, default=2.0,
                    help="analysis budget: larger variables stream (default: the library's 2 GiB)")
    ap.add_argument("--workdir", default=None, help="where the cube is written (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the cube")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.n_samples, int(a.max_resident_gib * 2**30))
        return
    work = Path(a.workdir or tempfile.mkdtemp(prefix="synclib-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    path = work / "bench_cube.nc"
    shape = dict(episodes=a.episodes, seeds=a.seeds, rounds=a.rounds, layers=a.layers, dim=a.dim)
    try:
        timing = write_cube(path, a.episodes, a.seeds, a.rounds, a.layers, a.dim)
        var_bytes = a.episodes * a.seeds * a.rounds * a.layers * a.dim * 4
        proc = subprocess.run([sys.executable, __file__, "--child", str(path), "--n-samples", str(a.n_samples),
                               "--max-resident-gib", str(a.max_resident_gib)],
                              check=True, stdout=subprocess.PIPE, text=True)
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        import torch

        out = {
            "benchmark": "analysis_stream",
            "machine": {"python": platform.python_version(), "torch": torch.__version__,
                        "platform": platform.platform(), "cpu_count": os.cpu_count(),
                        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                        "load_avg_1min": round(os.getloadavg()[0], 2)},
            "shape": shape,
            "hidden_variable_gib_in_memory": round(var_bytes / 2**30, 2),
            "cube_file_gib": round(path.stat().st_size / 2**30, 2),
            "samples_read_per_fit_gib": round(
                2 * (measured["n_train"] + measured["n_test"]) * a.layers * a.dim * 4 / 2**30, 2),
            **timing,
            "analysis": measured,
            "what": "genuine A->B grid, one split seed, alpha 0.1, float32 on CPU; hidden variables "
                    f"above {a.max_resident_gib} GiB streamed; synthetic states",
        }
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    paper = shape == dict(episodes=450, seeds=3, rounds=8, layers=32, dim=4096)
    RESULTS.mkdir(exist_ok=True)
    f = RESULTS / ("analysis_stream_cpu.json" if paper else "analysis_stream_cpu_small.json")
    f.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    print(f"wrote {f}")


if __name__ == "__main__":
    main()
