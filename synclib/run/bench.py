"""``synclib bench``: measure one ordered run's dialog loop on this machine, so that the dry run prices the grid
from your own card rather than from ours.

:func:`measure` plays one part of a config's ordered run (by default ``units_per_part`` tasks x one seed, with
the run's own models and settings, on its device) into a scratch cube, every timed part synchronised with the
device, and returns a record in the format of ``bench/bench_scheduling.py``: the loop's wall seconds (models
loaded before the clock starts), utterances generated and read, seconds by part, engine counters, peak GPU
memory, card, commit and versions. :func:`write` keeps it in ``RESULTS/bench/``, where
:func:`synclib.run.price.loop_reference` finds it first. :func:`machine_info` and :func:`loop_summary` are also
the ``bench/`` scripts' records.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

from synclib import __version__
from synclib.cube import open_cube
from synclib.models import load_model
from synclib.paths import REPO_ROOT, display
from synclib.run.pipeline import simulate_call
from synclib.run.price import LOCAL_DIR, card_name
from synclib.shapes import model_shape
from synclib.simulate import default_units_per_part, simulate

__all__ = ["machine_info", "loop_summary", "git_commit", "measure", "write", "local_measurements"]

def git_commit(root: Path = REPO_ROOT) -> str | None:
    """The checkout's commit (short hash, ``+`` when the tree has changes), or None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+" if dirty else "") if head else None


def machine_info(device) -> dict:
    """The machine a benchmark ran on: versions, CPU count, device (on CUDA its card and GiB), commit."""
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "device": str(device), "synclib": __version__, "commit": git_commit()}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    if str(device).startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2 ** 30, 1))
    else:
        info["cpu"] = platform.processor() or platform.machine()
    return info


def loop_summary(stats: dict, wall: float, utterances: int) -> dict:
    """One measured loop from ``simulate``'s ``engine_stats``: rates, steps, rows, prefill, reuse and seconds by
    part (``other``: host work between the timed parts)."""
    prefill, computed = stats.get("prefill_tokens", 0), stats.get("prefill_computed", 0)
    reused, steps, rows = stats.get("reused_tokens", 0), stats.get("decode_steps", 0), stats.get("generated_tokens", 0)
    seconds = {k[len("seconds_"):]: round(v, 2) for k, v in stats.items() if k.startswith("seconds_")}
    return {"wall_s": round(wall, 2), "utterances": utterances, "utterances_per_s": round(utterances / wall, 3),
            "decode_steps": steps, "decode_row_steps": rows, "rows_per_step": round(rows / max(steps, 1), 2),
            "forward_calls": stats.get("forward_calls", 0), "prefill_tokens": prefill,
            "prefill_computed": computed, "prefill_useful_share": round(prefill / max(computed, 1), 4),
            "reused_tokens": reused, "reused_share_of_prompt_tokens": round(reused / max(reused + prefill, 1), 4),
            "stream_joins": stats.get("stream_joins", 0), "graph_steps": stats.get("graph_steps", 0),
            "graph_fallbacks": stats.get("graph_fallbacks", 0),
            "host_reads_per_step": round(stats.get("host_reads", 0) / max(steps, 1), 3),
            "seconds": {**seconds, "other": round(wall - sum(seconds.values()), 2)},
            "counters": {k: v for k, v in stats.items() if not k.startswith("seconds_")}}


def _bench_config(cfg: dict, tasks: int | None, seeds: int) -> dict:
    """``cfg`` cut to the first ``tasks`` tasks (default: a full part) x the first ``seeds`` seeds."""
    sim = dict(cfg["simulate"])
    device = cfg["device"] if cfg["device"] not in (None, "auto") else None
    units = sim["units_per_part"] or default_units_per_part(device or _auto_device())
    picked = sim["seeds"][:seeds]
    n = tasks or max(1, -(-units // len(picked)))
    episodes = sim["episodes"] if isinstance(sim["episodes"], list) else list(range(sim["episodes"]))
    sim.update(episodes=episodes[:n], seeds=picked,
               passive_seeds=None if sim["passive_seeds"] is None else
               [s for s in sim["passive_seeds"] if s in picked] or None,
               tom_episodes=None if sim["tom_episodes"] is None else min(sim["tom_episodes"], n))
    return {**cfg, "simulate": sim}


def _auto_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def measure(cfg: dict, run, tasks: int | None = None, seeds: int = 1, progress: bool = True) -> dict:
    """Play one part of ordered run ``run`` (:class:`synclib.run.pipeline.Run`) of ``cfg`` on this
    machine and return its record (the module doc); the scratch cube is deleted."""
    import torch

    small = _bench_config(cfg, tasks, seeds)
    (spec_a, spec_b), call = simulate_call(small, run, progress=progress, sync_timing=True)
    opts = call["options"]
    t_load = time.perf_counter()
    lm_a = load_model(spec_a, dtype=opts.dtype, device=opts.device, prompt_format=opts.prompt_formats[0])
    lm_b = lm_a if (spec_a, opts.prompt_formats[0]) == (spec_b, opts.prompt_formats[1]) else \
        load_model(spec_b, dtype=opts.dtype, device=opts.device, prompt_format=opts.prompt_formats[1])
    load_s = time.perf_counter() - t_load
    device = lm_a.device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory(prefix="synclib-bench-") as tmp:
        t0 = time.perf_counter()
        cube_path = simulate(lm_a, lm_b, out=Path(tmp) / f"{run.name}.nc", **call)
        wall = time.perf_counter() - t0
        with open_cube(cube_path, chunks=None) as cube:
            generated = int(cube["n_utterances"].values.sum())
            if "n_utterances_tom" in cube:
                generated += int(cube["n_utterances_tom"].values.clip(0).sum())
            reads = 0
            if "passive_reader" in cube:
                read = cube["passive_reader"].values != ""
                reads = int(cube["n_utterances"].values[read].sum())
            prompt_max = int(max(cube["prompt_len_a"].values.max(), cube["prompt_len_b"].values.max()))
    stats = opts.engine_stats
    summary = loop_summary(stats, wall, generated)
    summary.update(reads=reads, prompt_tokens_max=prompt_max, load_s=round(load_s, 1),
                   peak_gpu_gib=round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2) if cuda else None)
    shapes = [model_shape(s) for s in (spec_a, spec_b)]
    counts = [_n_params(lm_a), _n_params(lm_b)]
    model = {"specs": [spec_a, spec_b], "labels": [cfg["models"][run.a]["label"], cfg["models"][run.b]["label"]],
             "n_params": int(sum(counts) / 2), "n_params_each": counts,
             "n_layers_each": [lm_a.n_layers, lm_b.n_layers], "d_model_each": [lm_a.d_model, lm_b.d_model],
             "n_layers": max(lm_a.n_layers, lm_b.n_layers), "d_model": max(lm_a.d_model, lm_b.d_model),
             "kv_bytes_per_token": [s.kv_bytes_per_token(torch.tensor([], dtype=lm_a.dtype).element_size())
                                    if s else None for s in shapes],
             "dtype": str(lm_a.dtype).replace("torch.", ""), "weights": "the run's own checkpoints"}
    sim = small["simulate"]
    return {
        "benchmark": "scheduling", "source": "synclib bench",
        "config": {"name": cfg["name"], "run": run.name, "scenarios": display(cfg["scenarios"])},
        "settings": {"tasks": len(call["tasks"]), "seeds": list(sim["seeds"]), "max_utterances": sim["max_utterances"],
                     "max_new_tokens": sim["max_new_tokens"], "batch_size": call["batching"].units_per_part,
                     "max_rows": sim["max_rows"], "passive": sim["passive"], "tom": sim["tom"],
                     "dtype": model["dtype"], "scheduling": sim["scheduling"], "sync_timing": True,
                     "stop_at_first_line": sim["stop_at_first_line"], "tasks_from": display(cfg["scenarios"])},
        "results": {run.name: {"model": model, "modes": {sim["scheduling"]: summary}}},
        "machine": machine_info(device), "date": time.strftime("%Y-%m-%d"), "time": time.strftime("%H:%M:%S"),
    }


def _n_params(lm) -> int:
    return int(sum(p.numel() for p in lm.model.parameters()))


def write(cfg: dict, record: dict) -> Path:
    """Keep ``record`` as ``RESULTS/bench/loop-DEVICE-DATE-TIME.json`` (DEVICE: card class or ``cpu``); its path."""
    m = record["machine"]
    device = card_name(m["gpu"]) if m.get("gpu") else "cpu"
    out = Path(cfg["results_dir"]) / LOCAL_DIR / f"loop-{device}-{record['date']}-{record['time'].replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    os.replace(tmp, out)
    return out


def local_measurements(results_dir) -> list[Path]:
    """The loop measurements ``synclib bench`` kept for a run (``RESULTS/bench/loop-*.json``)."""
    d = Path(results_dir) / LOCAL_DIR
    return sorted(d.glob("loop-*.json")) if d.is_dir() else []

