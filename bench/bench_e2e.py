"""Benchmark: one end-to-end ``synclib run`` of the main job, timed job by job.

Two random-init models of one shape (``--preset``; ``mistral7b``: the
Mistral-7B shape, 32 layers x 4096, bfloat16 on CUDA; ``tiny``: 4 layers x 256,
to check the script on a CPU) are built from a config, saved as Hugging Face
directories (weights and the random tokenizer of ``bench_simulate.py``) and
played against each other in both speaking orders (pair ``M-N``, ``orders: both``)
on ``--tasks`` embedded Sotopia-format tasks, with the paper's limits (16
utterances, 300 new tokens), the passive and ToM passes, a local judge (model
``M``, constrained scoring, ``--judge-sample`` dialogs per run), the analyses on
the same device, and, with ``--book``, every notebook and the book.

Replies of random weights: the tokenizer places a line break on one filler
token in ``--newline-every`` (default 64).  The dialog keeps only a reply's
first line, as the paper's code does, and synclib stops generating there, so
replies run about 64 tokens on average (the 300-token limit still applies);
without such a rule a random model never ends a reply and every utterance would
cost the full 300 tokens.

Results (JSON, default ``bench/results/e2e_<device>_<preset>.json``): the
run's wall time, every job's seconds and peak GPU memory (from the pipeline's
``*.done.json`` stamps), the cubes' utterance counts and prompt lengths, and the
projected GPU-hours of the paper's grid (36 ordered runs x 450 tasks x 5 seeds)
computed from the simulate jobs' measured rate.

    python bench/bench_e2e.py --device cuda --book      # H100 / H200
    python bench/bench_e2e.py --device cpu --preset tiny --tasks 4 --max-utterances 4
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_simulate import build_random_model, machine_info  # noqa: E402

#: the paper's grid: 36 ordered runs x 450 tasks x 5 simulation seeds
PAPER_RUNS, PAPER_TASKS, PAPER_SEEDS = 36, 450, 5


def build_models(root: Path, preset: str, device: str, newline_every: int) -> dict:
    """Two random models (seeds 0 and 1) saved as HF directories ``root/M``, ``root/N``."""
    info = {}
    for key, seed in (("M", 0), ("N", 1)):
        out = root / key
        if (out / "config.json").exists():
            info[key] = {"path": str(out), "reused": True}
            continue
        t0 = time.perf_counter()
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        lm, meta = build_random_model(preset, device, dtype, seed=seed, newline_every=newline_every)
        lm.model.save_pretrained(out)
        lm.tokenizer.save_pretrained(out)
        del lm
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        info[key] = {"path": str(out), **meta, "build_and_save_s": round(time.perf_counter() - t0, 1)}
        print(json.dumps(info[key]), flush=True)
    return info


def write_config(path: Path, models: Path, results: Path, args) -> dict:
    import yaml

    label = {"mistral7b": "Mistral-7B shape", "tiny": "tiny shape"}[args.preset]
    cfg = {
        "name": f"e2e-{args.preset}",
        "results_dir": str(results),
        "scenarios": "embedded",
        "device": args.device,
        "dtype": "auto",
        "models": {k: {"spec": str(models / k), "family": "Random",
                       "label": f"random {label} (seed {i})"} for i, k in enumerate("MN")},
        "pairs": ["M-N"], "orders": "both",
        "simulate": {"episodes": args.tasks, "seeds": [0], "max_utterances": args.max_utterances,
                     "max_new_tokens": args.max_new_tokens, "temperature": 0.7, "units_per_part": args.tasks,
                     "passive": True, "tom": True, "store_dtype": "float32"},
        "judge": {"model": str(models / "M"), "url": None, "mode": "constrained", "concurrency": 8,
                  "sample": args.judge_sample},
        "analysis": {"alpha": 0.1, "n_samples": 6500, "split_seeds": [0, 1, 2], "lags": [1, 2],
                     "sample_sizes": args.sample_sizes, "persona_disjoint": True, "relationship": True,
                     "nonlinear": True, "tom": True, "max_resident_gib": 8},
        "notebooks": {"ability_scores": None},
        "cluster": None,
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg


def collect_stamps(results: Path) -> dict:
    """Every job's ``*.done.json`` (seconds, peak GPU memory, a simulate job's engine counters
    with its prefix reuse: reused / (reused + prefilled) prompt tokens) by output name."""
    out = {}
    roots = [results, REPO / "book" / "executed", REPO / "_build" / "html"]
    for root in roots:
        for f in sorted(root.rglob("*.done.json")) if root.exists() else []:
            d = json.loads(f.read_text())
            row = {k: d[k] for k in ("seconds", "peak_gpu_gib", "engine") if k in d}
            if "engine" in row:
                e = row["engine"]
                row["prefix_reuse"] = round(e.get("reused_tokens", 0) / max(1, e.get("reused_tokens", 0)
                                                                            + e.get("prefill_tokens", 0)), 3)
            out[str(f.relative_to(root.parent if root != results else results))[:-len(".done.json")]] = row
    return out


def cube_counts(results: Path) -> dict:
    from synclib.cube import open_cube

    out = {}
    for f in sorted((results / "cubes").glob("*.nc")):
        ds = open_cube(f, chunks=None)
        pl = ds.prompt_len_a.values
        out[f.stem] = {"episodes": int(ds.sizes["episode"]), "seeds": int(ds.sizes["sim_seed"]),
                       "utterances": int(ds.n_utterances.values.sum()),
                       "utterances_tom": int(ds.n_utterances_tom.values.sum()),
                       "passive_reads": int(np.isfinite(ds.hidden_a_passive.values[..., 0, 0]).sum()
                                            + np.isfinite(ds.hidden_b_passive.values[..., 0, 0]).sum()),
                       "reply_chars_mean": float(np.mean([len(t) for t in ds.text_a.values.ravel() if t])),
                       "prompt_tokens_agent1": {"min": int(pl[pl >= 0].min()), "max": int(pl[pl >= 0].max()),
                                                "mean": round(float(pl[pl >= 0].mean()), 1)},
                       "file_bytes": f.stat().st_size}
    return out


def projection(stamps: dict, counts: dict, tasks: int) -> dict:
    """GPU-hours of the paper's grid from the measured simulate jobs (same batch and limits)."""
    sim = [v["seconds"] for k, v in stamps.items() if k.startswith("cubes/")]
    if not sim:
        return {}
    per_run_s = float(np.mean(sim))
    per_episode_s = per_run_s / tasks  # one seed per run here
    hours = per_episode_s * PAPER_TASKS * PAPER_SEEDS * PAPER_RUNS / 3600
    return {"simulate_seconds_per_ordered_run": round(per_run_s, 1),
            "simulate_seconds_per_episode": round(per_episode_s, 3),
            "paper_grid_episodes": PAPER_TASKS * PAPER_SEEDS * PAPER_RUNS,
            "paper_grid_simulate_gpu_hours": round(hours, 2),
            "note": ("simulation with the passive and ToM passes, at this run's batch size; the paper "
                     "grid runs 450 tasks per run, so its batches are full (64 rows or more), which only "
                     "lowers the per-episode cost. Judging (a served gpt-oss-120b in the paper) is not "
                     "included; the ridge grids are in ridge_paper_cuda.json.")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", choices=("mistral7b", "tiny"), default=None,
                    help="model shape (default: mistral7b on CUDA, tiny on CPU)")
    ap.add_argument("--tasks", type=int, default=24, help="embedded tasks per run (default %(default)s)")
    ap.add_argument("--max-utterances", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=300)
    ap.add_argument("--newline-every", type=int, default=64,
                    help="one filler token in N ends a line (sets the random replies' mean length)")
    ap.add_argument("--judge-sample", type=int, default=4, help="dialogs judged per run (a random sample)")
    ap.add_argument("--sample-sizes", default="60,120", help="appendix D sizes (comma list)")
    ap.add_argument("--book", action="store_true", help="also execute the notebooks and build the book")
    ap.add_argument("--work", default=None, help="working folder (default: a folder in /tmp)")
    ap.add_argument("--out", default=None, help="JSON path")
    args = ap.parse_args(argv)
    args.preset = args.preset or ("mistral7b" if args.device.startswith("cuda") else "tiny")
    args.sample_sizes = [int(x) for x in args.sample_sizes.split(",") if x.strip()]
    work = Path(args.work or f"/tmp/synclib-e2e-{args.preset}")
    work.mkdir(parents=True, exist_ok=True)
    results = work / "results"

    t0 = time.perf_counter()
    models = build_models(work / "models", args.preset, args.device, args.newline_every)
    build_s = time.perf_counter() - t0
    cfg_path = work / "config.yaml"
    write_config(cfg_path, work / "models", results, args)
    steps = "simulate,judge,analyze" + (",notebooks,book" if args.book else "")
    # the notebooks' kernels import synclib: put this checkout on their path (an uninstalled copy works)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    cmd = [sys.executable, "-c", "import sys; from synclib.cli import main; sys.exit(main())",
           "run", "--config", str(cfg_path), "--steps", steps]
    print(" ".join(cmd), flush=True)
    t1 = time.perf_counter()
    log = work / "run.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            fh.write(line)
            if line.startswith("[synclib]") or "Error" in line or "error" in line:
                print(line, end="", flush=True)
        rc = proc.wait()
    run_s = time.perf_counter() - t1
    stamps = collect_stamps(results)
    counts = cube_counts(results) if rc == 0 or (results / "cubes").exists() else {}
    res = {"benchmark": "bench_e2e", "machine": machine_info(args.device), "preset": args.preset,
           "settings": {k: v for k, v in vars(args).items() if k not in ("work", "out")},
           "steps": steps, "returncode": rc, "model_build_s": round(build_s, 1), "models": models,
           "run_wall_s": round(run_s, 1), "jobs": stamps, "cubes": counts,
           "projection": projection(stamps, counts, args.tasks), "log_tail": log.read_text()[-3000:],
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(args.out) if args.out else HERE / "results" / f"e2e_{args.device.split(':')[0]}_{args.preset}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("returncode", "run_wall_s", "jobs", "projection")}, indent=1))
    print(f"wrote {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
