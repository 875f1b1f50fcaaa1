"""Reference parity of the analysis: ``synclib.analysis.analyze`` against the reference code.

The paper's numbers come from GitHub ``zzn-nzz/LM_neural_synchrony`` at commit
49fe97e1e22b18061cae49aec14aba69a9ec0e8c.  This tool runs *that code* (its own files, from a
checkout; nothing of it is copied here) and synclib on the same activation cube and compares:

1. A cube (default: ``make_synthetic_cube`` of tests/synthetic.py with 120 episodes x 5 simulation
   seeds, 4 x 8 and 3 x 6 hidden states; or ``--cube`` a file written by ``synclib simulate``)
   is exported into the reference's on-disk layout
   (``sotopia_results/{RUN}/all/episode_{e}/t0.7_seed{s}/agent_{a}_turn_{t}/states.npy``,
   ``(L, 1, D)`` float32; passive states under ``{RUN}_anotherread``), one mode ``all``, the
   episodes listed in cube order.  Model A is labelled Mistral-7B-Instruct-v0.2 and model B
   Llama-3-8B-Instruct, because the reference's file names need those family names.
2. In a subprocess (the reference's two ``utils`` modules clash), the reference's
   ``affine_transformation.py`` is loaded with ``'cuda'`` replaced by ``'cpu'`` (a shim that
   lives here, not in synclib), ``get_all_modes`` returns the exported list, and
   ``linear_all_reps_layer_by_layer`` trains every layer pair for split seeds 0, 1, 2 and both
   directions (``A_forward``, ``B_forward``) in the conditions genuine, passive
   (``another_read``), lag 1 and 2 (``data_mode`` ``step_3``/``step_5``) and shuffled
   (``shuffle=True``).  Then ``playground/data_analysis.py`` (with ``playground/utils.py``)
   ``get_r2_scores_setting(..., get_se=True)`` aggregates them.
3. synclib analyses the same cube (``analyze``, same ``n_samples``, split seeds 0, 1, 2,
   alpha 0.1) and the tool compares, per direction and condition: the split (episode lists
   in the order taken), the test and training R^2 grids per split seed, the seed-mean grid,
   SyncR^2 and its standard error; plus the unclipped and top-k SyncR^2 (no reference
   code: synclib's formulas on the reference's mean grid).  Target: every difference <= 1e-5.

Numerics: the reference solves float32 normal equations on raw activations; synclib solves
the centred ridge exactly (float64 factorisations).  They agree to ~1e-7 when the training
set is much larger than the width, so the default data have ``n_train`` >> D (about 2,000
training samples for widths 8 and 6); with ``n_train < D`` expect ~1e-4 (ref notes 10.8).
The default ``--n-samples`` (2,500) splits the genuine, passive and shuffled datasets
normally and puts the lag datasets under the short rule (test first, training all the rest),
so both branches of the split are compared.

How to run (CPU only, about half a minute with the defaults)::

    .venv/bin/python tools/reference_analysis_parity.py --reference /tmp/ref
    .venv/bin/python tools/reference_analysis_parity.py --reference /tmp/ref --cube runs/x/cube.nc \\
        --n-samples 6500

``--reference`` is a checkout (or ``git archive`` extraction) of the commit above.  Writes
``bench/results/analysis_parity.json`` (``--out``) and prints a table; exit status 0 when every
difference is within ``--tol`` and every split equal, 1 otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the synthetic cubes
from synclib.analysis import analyze, build_dataset, sim_seed_rank, sync_r2_noclip, sync_r2_topk  # noqa: E402
from synthetic import Planted, Shapes, make_synthetic_cube  # noqa: E402
from synclib.cube import open_cube  # noqa: E402
from synclib.splits import episode_split  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COMMIT = "49fe97e1e22b18061cae49aec14aba69a9ec0e8c"
MODEL_1, MODEL_2 = "Mistral-7B-Instruct-v0.2_None_0", "Llama-3-8B-Instruct_None_0"
RUN = f"{MODEL_1}_{MODEL_2}"
SEED_LIST = [0, 1, 2, 3, 4]   # the reference's simulation seeds (its file names hard-code them)
SPLIT_SEEDS = (0, 1, 2)
#: condition -> (data_mode, shuffle, another_read) of the reference
CONDITIONS = {"genuine": ("combined_metrics", False, False), "passive": ("combined_metrics", False, True),
              "lag1": ("step_3", False, False), "lag2": ("step_5", False, False),
              "shuffled": ("combined_metrics", True, False)}
DIRECTIONS = {"A->B": "A", "B->A": "B"}   # synclib direction -> the reference's setting[0]
QUANTITIES = ("r2_per_seed", "r2_mean", "train_r2_per_seed", "sync_r2", "sync_r2_se", "sync_r2_noclip",
              "sync_r2_topk")
SYNTHETIC = dict(n_episodes=120, n_seeds=5, n_rounds=8, shapes=Shapes(layers_a=4, dim_a=8, layers_b=3, dim_b=6),
                 coupling=0.8, seed=0, planted=Planted(signal=2.0))


def _synthetic_record(n_episodes: int) -> dict:
    """The synthetic cube's settings as JSON (the option objects as dicts)."""
    return {**{k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in SYNTHETIC.items()},
            "n_episodes": n_episodes}


# --------------------------------------------------------------------------- export
def export_cube(cube, root: Path) -> dict:
    """Write ``cube``'s hidden states into the reference's layout under ``root``.

    Returns the layout: ``episodes`` (the reference's episode list: cube positions),
    ``seed_dirs`` (the seed directory of each sim_seed position) and file counts.
    """
    S = cube.sizes["sim_seed"]
    if S > len(SEED_LIST):
        raise SystemExit(f"--cube: the reference reads simulation seeds {SEED_LIST}; this cube has {S}")
    seed_dir = [int(r) for r in sim_seed_rank(cube)]  # seed values in ascending order -> 0 .. S-1
    written = {}
    for run, view in ((RUN, ""), (RUN + "_anotherread", "_passive")):
        names = [f"hidden_a{view}", f"hidden_b{view}"]
        if any(n not in cube.variables for n in names):
            continue
        n = 0
        for e in range(cube.sizes["episode"]):
            ha, hb = (np.asarray(cube[v].isel(episode=e).values, dtype=np.float32) for v in names)
            for s in range(S):
                for k in range(cube.sizes["round"]):
                    for agent, h, turn in ((1, ha, 2 * k), (2, hb, 2 * k + 1)):
                        if np.isfinite(h[s, k]).all():
                            d = root / "sotopia_results" / run / "all" / f"episode_{e}" / \
                                f"t0.7_seed{seed_dir[s]}" / f"agent_{agent}_turn_{turn}"
                            d.mkdir(parents=True, exist_ok=True)
                            np.save(d / "states.npy", h[s, k][:, None, :])
                            n += 1
        written[run] = n
    return {"episodes": list(range(cube.sizes["episode"])), "seed_dirs": seed_dir, "files": written}


# --------------------------------------------------------------------------- the reference (worker)
def _load(name: str, path: Path, source: str | None = None) -> types.ModuleType:
    """Import ``path`` as module ``name``; ``source`` replaces its text (the CPU shim)."""
    if source is None:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    mod = types.ModuleType(name)
    mod.__file__ = str(path)
    exec(compile(source, str(path), "exec"), mod.__dict__)
    return mod


def _train(ref: Path, work: Path, spec: dict) -> dict:
    """Run the reference's training for every (condition, direction); read its JSONs back."""
    sys.path.insert(0, str(ref))
    src = (ref / "affine_transformation.py").read_text().replace("'cuda'", "'cpu'")
    at = _load("ref_affine_transformation", ref / "affine_transformation.py", src)
    at.get_all_modes = lambda: (["all"], {"all": spec["episodes"]})
    os.chdir(work)
    out = {}
    for cond in spec["conditions"]:
        data_mode, shuffle, another = CONDITIONS[cond]
        run = RUN + ("_anotherread" if another else "")
        ident = at.get_short_names_and_identifiers([run])[1] + str(SEED_LIST)
        for direction, side in DIRECTIONS.items():
            la, lb = spec["layers"][side], spec["layers"]["B" if side == "A" else "A"]
            key = f"{cond} {direction}"
            try:
                at.linear_all_reps_layer_by_layer(
                    [run], SPLIT_SEEDS, (side, "forward"), seed_list=SEED_LIST,
                    precomputed_sample_num=spec["n_samples"], shuffle=shuffle, A_range=la, B_range=lb,
                    data_mode=data_mode, another_read=another)
            except Exception as exc:  # noqa: BLE001 - the reference's own failures are results here
                out[key] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            base = work / f"affine_transformation{'_shuffled' if shuffle else ''}" / f"{side}_forward"
            cells = [[json.loads((base / f"layerA{i}" / "data" /
                                  f"{data_mode}_{ident}_layerA{i}_layerB{j}_allreps.json").read_text())
                      for j in range(lb)] for i in range(la)]
            first = next(iter(cells[0][0].values()))
            grid = lambda f: np.array([[[v[0] for v in next(iter(c.values()))[f]] for c in row]  # noqa: E731
                                       for row in cells]).transpose(2, 0, 1).tolist()
            out[key] = {"r2": grid("r2_all_seeds"), "train_r2": grid("train_r2_all_seeds"),
                        "test_set_idx": first["test_set_idx"], "train_set_idx": first["train_set_idx"]}
    return out


def _aggregate(ref: Path, work: Path, spec: dict, out: dict) -> None:
    """The reference's SyncR^2 and SE (``get_r2_scores_setting(..., get_se=True)``) into ``out``."""
    sys.modules.pop("utils", None)  # data_analysis needs playground/utils.py, not the root one
    sys.path.insert(0, str(ref / "playground"))
    da = _load("ref_data_analysis", ref / "playground" / "data_analysis.py")
    la, lb = spec["layers"]["A"], spec["layers"]["B"]
    da.get_layer_range = lambda m: (0, la - 1) if "Mistral" in m else (0, lb - 1)
    (work / "playground").mkdir(exist_ok=True)
    os.chdir(work / "playground")
    for cond in spec["conditions"]:
        data_mode, shuffle, another = CONDITIONS[cond]
        for direction, side in DIRECTIONS.items():
            key = f"{cond} {direction}"
            if "error" in out[key]:
                continue
            try:
                avg, se = da.get_r2_scores_setting(MODEL_1, MODEL_2, f"{side}_forward", get_se=True,
                                                   shuffled=shuffle, data_mode=data_mode, anotherread=another)
            except SystemExit:  # it quit()s on a missing file
                out[key]["error"] = "get_r2_scores_setting quit (missing file)"
                continue
            out[key].update(sync_r2=float(avg), sync_r2_se=float(se))


def worker(spec_path: Path) -> None:
    """Subprocess entry: the reference's training and aggregation, results to ``result.json``."""
    spec = json.loads(spec_path.read_text())
    ref, work = Path(spec["reference"]), Path(spec["work"])
    with open(work / "reference.log", "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        out = _train(ref, work, spec)
        _aggregate(ref, work, spec, out)
    (work / "result.json").write_text(json.dumps(out))


def run_reference(ref: Path, work: Path, spec: dict) -> dict:
    """Run :func:`worker` in a fresh interpreter; returns its results per 'condition direction'."""
    spec = {**spec, "reference": str(ref), "work": str(work)}
    (work / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(work / "spec.json")],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        log = (work / "reference.log").read_text()[-3000:] if (work / "reference.log").exists() else ""
        raise SystemExit(f"the reference run failed ({proc.returncode}):\n{proc.stderr[-3000:]}\n{log}")
    return json.loads((work / "result.json").read_text())


# --------------------------------------------------------------------------- synclib and comparison
def synclib_splits(cube, n_samples: int, conditions: list) -> dict:
    """synclib's episode lists per 'condition direction': [(test, train) per split seed]."""
    out = {}
    for cond in conditions:
        for direction in DIRECTIONS:
            ds = build_dataset(cube, direction, "genuine" if cond == "shuffled" else cond)
            out[f"{cond} {direction}"] = []
            for seed in SPLIT_SEEDS:
                try:
                    _, _, info = episode_split(ds.episode, n_samples, seed, n_groups=cube.sizes["episode"])
                    out[f"{cond} {direction}"].append((info["test_groups"].tolist(), info["train_groups"].tolist()))
                except ValueError as exc:
                    out[f"{cond} {direction}"].append(str(exc))
    return out


def compare_one(ours, ref: dict, splits: list, Ls: int, Lt: int) -> dict:
    """Largest differences of one (condition, direction): ``ours`` is the result selected there."""
    r2 = ours.r2.values[:, :Ls, :Lt]
    ref_r2, ref_tr = np.array(ref["r2"]), np.array(ref["train_r2"])
    M = ref_r2.mean(0)
    k = np.arange(1, Lt + 1)
    diff = {
        "r2_per_seed": np.abs(r2 - ref_r2).max(),
        "r2_mean": np.abs(ours.r2_mean.values[:Ls, :Lt] - M).max(),
        "train_r2_per_seed": np.abs(ours.train_r2.values[:, :Ls, :Lt] - ref_tr).max(),
        "sync_r2": abs(float(ours.sync_r2) - ref["sync_r2"]),
        "sync_r2_se": abs(float(ours.sync_r2_se) - ref["sync_r2_se"]),
        "sync_r2_noclip": abs(float(ours.sync_r2_noclip) - sync_r2_noclip(M)),
        "sync_r2_topk": np.abs(ours.sync_r2_topk.sel(k=k).values - [sync_r2_topk(M, j) for j in k]).max(),
    }
    split_equal = [isinstance(s, tuple) and [list(s[0]), list(s[1])] == [t, r]
                   for s, t, r in zip(splits, ref["test_set_idx"], ref["train_set_idx"])]
    return {"max_abs_diff": {q: float(v) for q, v in diff.items()}, "split_equal": split_equal,
            "ours": {"sync_r2": float(ours.sync_r2), "sync_r2_se": float(ours.sync_r2_se)},
            "reference": {"sync_r2": ref["sync_r2"], "sync_r2_se": ref["sync_r2_se"]},
            "n_available": int(ours.n_available), "n_train": ours.n_train.values.tolist(),
            "n_test": ours.n_test.values.tolist(), "split_short": ours.split_short.values.tolist()}


def compare(res, ref: dict, splits: dict, layers: dict, tol: float) -> dict:
    """Every (condition, direction) of ``res`` against the reference; the overall verdict."""
    jobs, worst = [], {q: 0.0 for q in QUANTITIES}
    for cond in res.condition.values:
        for direction, side in DIRECTIONS.items():
            key = f"{cond} {direction}"
            Ls, Lt = layers[side], layers["B" if side == "A" else "A"]
            job = {"condition": str(cond), "direction": direction, "reference_setting": f"{side}_forward",
                   "reference_data_mode": CONDITIONS[str(cond)][0]}
            if "error" in ref[key]:
                job["error"] = ref[key]["error"]
            else:
                job.update(compare_one(res.sel(condition=cond, direction=direction), ref[key], splits[key], Ls, Lt))
                worst = {q: max(worst[q], job["max_abs_diff"][q]) for q in QUANTITIES}
            jobs.append(job)
    ok = all("error" not in j and all(j["split_equal"]) for j in jobs) and max(worst.values()) <= tol
    return {"jobs": jobs, "max_abs_diff": worst, "pass": bool(ok)}


def print_table(report: dict) -> None:
    """A short table: one line per (condition, direction)."""
    print(f"{'condition':9} {'dir':4} {'n_av':>6} {'short':>5} {'split':>5} {'SyncR2 ours':>11} {'ref':>9} "
          f"{'SE ours':>9} {'ref':>9} {'max|dR2|':>9} {'max|dSync|':>10}")
    for j in report["jobs"]:
        if "error" in j:
            print(f"{j['condition']:9} {j['direction']:4} reference error: {j['error']}")
            continue
        d = j["max_abs_diff"]
        print(f"{j['condition']:9} {j['direction']:4} {j['n_available']:6d} {max(j['split_short']):5d} "
              f"{'ok' if all(j['split_equal']) else 'DIFF':>5} {j['ours']['sync_r2']:11.6f} "
              f"{j['reference']['sync_r2']:9.6f} {j['ours']['sync_r2_se']:9.6f} {j['reference']['sync_r2_se']:9.6f} "
              f"{max(d['r2_per_seed'], d['train_r2_per_seed']):9.2e} {max(d['sync_r2'], d['sync_r2_se']):10.2e}")
    print("largest differences: " + ", ".join(f"{q} {v:.2e}" for q, v in report["max_abs_diff"].items()))
    print("PASS" if report["pass"] else "FAIL")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", type=Path, help="checkout of zzn-nzz/LM_neural_synchrony @ " + COMMIT)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--cube", type=Path, help="a cube written by `synclib simulate`")
    src.add_argument("--synthetic", action="store_true", help="a synthetic cube (the default)")
    p.add_argument("--n-episodes", type=int, default=SYNTHETIC["n_episodes"], help="synthetic cube: episodes")
    p.add_argument("--n-samples", type=int, default=None,
                   help="N of the split (default: 2500 for the synthetic cube, 6500 for --cube)")
    p.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated (default: %(default)s)")
    p.add_argument("--tol", type=float, default=1e-5, help="largest allowed difference (default: %(default)s)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "analysis_parity.json")
    p.add_argument("--keep", action="store_true", help="keep the exported reference tree (its path is printed)")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is None and args.reference is None:
        p.error("--reference: the path of a reference checkout is needed")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        worker(args.worker)
        return 0
    ref = args.reference.resolve()
    for f in ("affine_transformation.py", "playground/data_analysis.py", "playground/utils.py", "utils.py"):
        if not (ref / f).exists():
            raise SystemExit(f"--reference: {ref} has no {f}; is it a checkout of the reference?")
    t0 = time.time()
    cube = open_cube(args.cube).load() if args.cube else make_synthetic_cube(
        **{**SYNTHETIC, "n_episodes": args.n_episodes})
    n_samples = args.n_samples or (6500 if args.cube else 2500)
    conditions = [c for c in args.conditions.split(",") if c]
    if "hidden_a_passive" not in cube.variables and "passive" in conditions:
        conditions.remove("passive")
    layers = {"A": cube.sizes["layer_a"], "B": cube.sizes["layer_b"]}
    res = analyze(cube, conditions=conditions, n_samples=n_samples, split_seeds=SPLIT_SEEDS, alpha=0.1,
                  device="cpu", progress=False, log=lambda m: None)
    work = Path(tempfile.mkdtemp(prefix="refparity_"))
    layout = export_cube(cube, work)
    ref_out = run_reference(ref, work, {"episodes": layout["episodes"], "conditions": conditions,
                                        "layers": layers, "n_samples": n_samples})
    report = compare(res, ref_out, synclib_splits(cube, n_samples, conditions), layers, args.tol)
    report = {
        "what": "synclib.analysis.analyze vs the reference's affine_transformation.py + "
                "playground/data_analysis.py (get_r2_scores_setting, get_se=True) on the same cube",
        "reference": {"repository": "zzn-nzz/LM_neural_synchrony", "commit": COMMIT, "path": str(ref)},
        "cube": {"source": str(args.cube) if args.cube else "synthetic",
                 **({} if args.cube else {"synthetic": _synthetic_record(args.n_episodes)}),
                 **{k: int(v) for k, v in cube.sizes.items() if k in ("episode", "sim_seed", "round", "layer_a",
                                                                      "dim_a", "layer_b", "dim_b")},
                 "files_exported": layout["files"]},
        "n_samples": n_samples, "split_seeds": list(SPLIT_SEEDS), "alpha": 0.1, "tolerance": args.tol,
        "solver": "synclib exact centred ridge (float64 factorisations) vs the reference's float32 normal "
                  "equations; data chosen with n_train >> width",
        "not_in_reference": "sync_r2_noclip, sync_r2_topk: synclib's formulas on the reference's mean grid",
        **report, "runtime_s": round(time.time() - t0, 1),
        "env": {"python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine(),
                "date": time.strftime("%Y-%m-%d %H:%M:%S")},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    print(f"wrote {args.out}" + (f"; reference tree kept in {work}" if args.keep else ""))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
