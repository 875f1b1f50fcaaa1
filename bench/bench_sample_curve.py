"""Benchmark: the measured sample-size curve of an embedded model pair.

One ordered run of an embedded pair over every embedded task, the paper's 16
utterances, with the passive reader, then SyncR^2 of every condition (genuine,
passive, shuffled, lag 1, lag 2) at a range of dataset sizes ``N`` (the paper's
split rule: whole episodes to the test set until it holds a fifth, the rest up to
``N`` for training) and with all samples.  Written as JSON to
``bench/results/sample_curve_<pair>.json``: per condition and size, SyncR^2 (the
mean of both directions, as a pair's value), each direction's value, the mean of
the directional standard errors over split seeds, and the training / test sample
counts actually used; plus machine, wall times and settings.

What reads it: the book (the figure 9 page and the first page quote it) and the size guard of
``synclib run`` (:mod:`synclib.analysis.sizing`), which warns when a run has fewer training
samples than the curve needs to lift SyncR^2 off zero.

Usage (about 6 minutes per pair on 2 cores)::

    python bench/bench_sample_curve.py --pair S-S        # SmolLM2-135M with itself
    python bench/bench_sample_curve.py --pair G-G        # Gemma-3-270M with itself
    python bench/bench_sample_curve.py --pair S-S --cube /tmp/S-S.nc   # keep / re-use the cube
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

MODELS = {"S": "smollm2-135m", "G": "gemma3-270m"}
CONDITIONS = ("genuine", "passive", "shuffled", "lag1", "lag2")
SIZES = (50, 75, 100, 150, 200, 250, 300, 350)


def _machine() -> dict:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}


def _point(ds, size) -> dict:
    """One size's numbers per condition, from an analysis Dataset."""
    out = {}
    for c in [str(v) for v in ds["condition"].values]:
        s = ds["sync_r2"].sel(condition=c)
        se = ds["sync_r2_se"].sel(condition=c)
        ntr = ds["n_train"].sel(condition=c).astype(float)
        nte = ds["n_test"].sel(condition=c).astype(float)
        short = size is not None and bool(((ntr + nte) < size).any())
        per_dir = {str(d): float(s.sel(direction=d)) for d in s["direction"].values}
        out[c] = {
            "n_samples": size, "short": short,
            "sync_r2": None if short else float(np.mean(list(per_dir.values()))),
            "se": None if short else float(se.mean()),
            "by_direction": None if short else per_dir,
            "n_train": {str(d): float(ntr.sel(direction=d).mean()) for d in ntr["direction"].values},
            "n_test": {str(d): float(nte.sel(direction=d).mean()) for d in nte["direction"].values},
        }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", default="S-S", help="S-S, G-G, S-G or G-S (S = SmolLM2-135M, G = Gemma-3-270M)")
    p.add_argument("--episodes", type=int, default=None, help="first N embedded tasks (default: all)")
    p.add_argument("--max-utterances", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="dataset sizes N, comma-separated")
    p.add_argument("--split-seeds", default="0,1,2")
    p.add_argument("--cube", default=None, help="cube path to write or re-use (default: a temporary file)")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/sample_curve_<pair>.json)")
    args = p.parse_args(argv)

    from synclib.analysis import analyze
    from synclib.cube import is_complete, open_cube
    from synclib.tasks.scenarios import load_tasks, select_tasks
    from synclib.simulate import Batching, Passes, RunOptions, Sampling, simulate

    a, b = args.pair.split("-")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    seeds = tuple(int(s) for s in args.split_seeds.split(","))
    taskset = load_tasks("embedded")
    tasks = select_tasks(taskset, args.episodes) if args.episodes else list(taskset)
    tmp = None
    if args.cube is None:
        tmp = tempfile.TemporaryDirectory()
        cube_path = Path(tmp.name) / f"{args.pair}.nc"
    else:
        cube_path = Path(args.cube)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    reused = is_complete(cube_path)
    simulate(MODELS[a], MODELS[b], tasks, [0], cube_path, max_utterances=args.max_utterances,
             sampling=Sampling(max_new_tokens=args.max_new_tokens), passes=Passes(passive=True, taskset=taskset),
             batching=Batching(units_per_part=args.batch_size), options=RunOptions(dtype=args.dtype, progress=False))
    t_sim = time.perf_counter() - t0
    cube = open_cube(cube_path)
    n_utt = cube["n_utterances"].to_numpy().ravel()
    widths = [int(cube.attrs["d_model_a"]), int(cube.attrs["d_model_b"])]
    layers = [int(cube.attrs["n_layers_a"]), int(cube.attrs["n_layers_b"])]

    points = []
    t1 = time.perf_counter()
    for size in sizes + [None]:
        print(f"[bench] analysing N = {size or 'all'}", file=sys.stderr, flush=True)
        ds = analyze(cube, conditions=CONDITIONS, alpha="cv", n_samples=size, split_seeds=seeds,
                     progress=False, log=lambda m: None)
        points.append(_point(ds, size))
    t_ana = time.perf_counter() - t1
    curve = {c: [pt[c] for pt in points if c in pt] for c in CONDITIONS}
    result = {
        "benchmark": "sample_curve", "pair": args.pair,
        "models": {"a": MODELS[a], "b": MODELS[b]}, "d_model": widths, "n_layers": layers,
        "settings": {"tasks": len(tasks), "scenarios": "embedded", "sim_seeds": [0],
                     "max_utterances": args.max_utterances, "max_new_tokens": args.max_new_tokens,
                     "dtype": args.dtype, "batch_size": args.batch_size, "passive": True,
                     "alpha": "cv", "split_seeds": list(seeds), "sizes": sizes,
                     "split_rule": "the paper's code: whole episodes to the test set until it holds "
                                   "N - int(0.8 N) samples, then to the training set (all the rest "
                                   "for N = null)"},
        "dialogs": {"units": int(n_utt.size), "mean_utterances": float(n_utt.mean()),
                    "full_length": int((n_utt >= args.max_utterances).sum()), "utterances": int(n_utt.sum())},
        "wall_s": {"simulate": None if reused else round(t_sim, 1), "analysis": round(t_ana, 1)},
        "curve": curve,
        "machine": {**_machine(), "load_avg_1min_before": round(load_before, 2),
                    "load_avg_1min_after": round(os.getloadavg()[0], 2)},
        "date": time.strftime("%Y-%m-%d"),
    }
    out = Path(args.out) if args.out else HERE / "results" / f"sample_curve_{args.pair}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    g = curve["genuine"][-1]
    print(f"wrote {out}: genuine SyncR2 {g['sync_r2']:.3f} with all samples "
          f"(n_train {g['n_train']}); simulate {result['wall_s']['simulate']} s, analysis {t_ana:.0f} s")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
