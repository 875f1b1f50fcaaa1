"""Benchmark: where a finished main job's time and memory went, as rates the dry run scales.

Reads a run's own records (``RESULTS/run-log.jsonl``: each job's seconds and peak resident
memory; ``RESULTS/manifest.json``: its configuration) and writes
``bench/results/main_job_cpu.json``: per job kind, the rate that :mod:`synclib.run.plan` turns
into an estimate for another configuration:

- simulate: seconds per planned utterance of each ordered run (genuine dialogs, passive
  reads and ToM dialogs, each planned to ``max_utterances``: :func:`synclib.run.plan.simulate_work`);
- judge: seconds per judged dialog; analyze: seconds per ordered run and per episode;
- each notebook's seconds (run ``notebooks_at_once`` at a time, sharing the cores), the claims
  and the book; ``pipeline_seconds`` counts the notebooks so (:func:`synclib.run.plan.wall_seconds`);
- ``speed``: this machine's short timings of each model and of a ridge grid (:mod:`synclib.run.speed`), which
  the dry run on another machine repeats there and divides by these to scale every estimate.

With ``--float32 N``, it also times ``synclib simulate`` of the first pair on N tasks in
bfloat16 and in float32 on this machine (the ``float32_factor`` the dry run applies on a
CPU without native bfloat16); without it, the factor of the file it replaces is kept, with
the date it was measured.

Usage, after ``make book`` on an idle machine (``/usr/bin/time -v`` gives the job's peak)::

    python bench/bench_main_job.py --results results/embedded [--float32 16] [--wall 1234]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from synclib.models import cpu_has_native_bf16  # noqa: E402
from synclib.notebook import AT_ONCE  # noqa: E402
from synclib.run import speed  # noqa: E402
from synclib.run.plan import CALIBRATION, simulate_work, timed_items, wall_seconds  # noqa: E402


def last_run(log: Path) -> dict:
    """Each job's last 'finished' record of the log."""
    jobs = {}
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("event") == "finished":
            jobs[rec["job"]] = rec
    return jobs


def time_dtypes(cfg: dict, n_tasks: int) -> dict:
    """Wall seconds of one ``synclib simulate`` of the first pair in each dtype."""
    a, b = cfg["pairs"][0].split("-")
    sim = cfg["simulate"]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("bfloat16", "float32"):
            cmd = [sys.executable, "-m", "synclib", "simulate", "--model-a", cfg["models"][a]["spec"],
                   "--model-b", cfg["models"][b]["spec"], "--episodes", str(n_tasks), "--device", "cpu",
                   "--dtype", dtype, "--max-new-tokens", str(sim["max_new_tokens"]),
                   "--max-utterances", str(sim["max_utterances"]), "--units-per-part", str(sim["units_per_part"]),
                   "--out", f"{tmp}/{dtype}.nc", "--no-progress"] + (["--passive"] if sim["passive"] else [])
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, cwd=REPO, capture_output=True)
            out[dtype] = round(time.perf_counter() - t0, 1)
    return {"pair": cfg["pairs"][0], "tasks": n_tasks, "seconds": out,
            "float32_factor": round(out["float32"] / out["bfloat16"], 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/embedded", help="the finished run's results directory")
    ap.add_argument("--float32", type=int, metavar="N", help="also time the first pair's simulation of N tasks "
                    "in bfloat16 and float32")
    ap.add_argument("--wall", type=float, help="the whole make book's wall seconds, as measured outside")
    ap.add_argument("--peak-gib", type=float, help="the whole make book's peak resident GiB (/usr/bin/time -v)")
    ap.add_argument("--out", default=str(HERE / "results" / CALIBRATION))
    args = ap.parse_args(argv)
    res = Path(args.results)
    cfg = json.loads((res / "manifest.json").read_text())["config"]
    jobs = last_run(res / "run-log.jsonl")
    kinds: dict = {"simulate": {}, "judge": {}, "analyze": {}, "notebooks": {}}
    work = simulate_work(cfg)
    for key, rec in jobs.items():
        kind, _, name = key.partition(":")
        entry = {"seconds": rec["seconds"], "peak_rss_gib": rec.get("peak_rss_gib")}
        if kind == "simulate":
            a, b = name.split("-")
            specs = (cfg["models"][a]["spec"], cfg["models"][b]["spec"])
            entry.update(specs=list(specs), planned_utterances=work["planned"],
                         seconds_per_utterance=round(rec["seconds"] / work["planned"], 4),
                         recomputed_tokens=rec.get("engine", {}).get("recomputed_tokens", 0))
            kinds["simulate"][name] = entry
        elif kind == "judge":
            n = int(cfg["judge"]["sample"] or 0) or None
            entry.update(dialogs=n, seconds_per_dialog=round(rec["seconds"] / n, 2) if n else None)
            kinds["judge"][name] = entry
        elif kind == "analyze":
            n = len(cfg["simulate"]["seeds"]) * int(cfg["simulate"]["episodes"])
            entry.update(dialogs=n, split_seeds=len(cfg["analysis"]["split_seeds"]))
            kinds["analyze"][name] = entry
        elif kind == "notebook":
            kinds["notebooks"][name] = entry
        elif kind in ("manifest", "claims", "book"):
            kinds[kind] = entry
    out = {"benchmark": "bench_main_job", "date": time.strftime("%Y-%m-%d"),
           "what": f"the jobs of `synclib run --config` {cfg['name']!r} ({args.results}) on this machine, "
                   "each job's seconds and peak resident memory from the run's log",
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpu_count": os.cpu_count(), "native_bf16": cpu_has_native_bf16(),
                       "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                                    .splitlines() if ln.startswith("model name")), platform.processor())},
           "dtype": cfg.get("dtype"), "device": cfg.get("device"),
           "settings": {k: cfg["simulate"][k] for k in ("episodes", "seeds", "max_utterances", "max_new_tokens",
                                                         "units_per_part", "passive", "passive_own", "tom",
                                                         "tom_episodes")},
           "jobs": kinds, "notebooks_at_once": AT_ONCE,
           "pipeline_seconds": round(wall_seconds((k, r["seconds"]) for k, r in jobs.items()), 1)}
    import torch
    import transformers

    out["machine"].update(torch=torch.__version__, transformers=transformers.__version__)
    out["dtype_used"] = "bfloat16" if out["machine"]["native_bf16"] else "float32"
    # the same short timings the dry run makes on a user's machine (synclib.run.speed), made here now
    out["speed"] = {"format": speed.SPEED_FORMAT, "dtype": out["dtype_used"], "machine": speed.machine_key(),
                    "timings": speed.measure(timed_items(cfg, out["dtype_used"]))}
    if args.wall:
        out["make_book_wall_s"] = args.wall
    if args.peak_gib:
        out["make_book_peak_rss_gib"] = args.peak_gib
    if args.float32:
        out["dtypes"] = time_dtypes(cfg, args.float32)
    elif Path(args.out).is_file():  # keep the last measured float32 factor, with its date
        old = json.loads(Path(args.out).read_text())
        if "dtypes" in old:
            out["dtypes"] = {**old["dtypes"], "measured": old["dtypes"].get("measured", old.get("date"))}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("pipeline_seconds", "dtype_used")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
