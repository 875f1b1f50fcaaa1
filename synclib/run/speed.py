"""This machine's speed, so that a CPU run is priced here and not on the machine that measured the main job.

The main job's calibration (:data:`synclib.run.plan.CALIBRATION`, ``bench/bench_main_job.py``) records, beside each
job's seconds, the same short timings made there: :func:`model_seconds` (a few forwards of each model in the dtype
that run used: a prefill of :data:`ROWS` x :data:`PREFILL_TOKENS` tokens, then :data:`DECODE_STEPS` one-token
steps of the same rows on their keys and values, the loop's two kinds of work) and :func:`ridge_seconds` (one CV
ridge grid at the analysis' shapes). A job's estimate on another machine is the calibration's seconds times the
ratio of this machine's timing to the calibration's (:func:`synclib.run.plan.machine_ratios`): a simulation by its
models' in the dtypes each machine runs them in, the judge by its model's in float32 (a local judge's dtype on a
CPU), an analysis by the ridge grid's. The timings take seconds once models are cached and are kept per machine
and thread count in ``$SYNCLIB_CACHE/speed.json`` (:func:`synclib.models.cache_dir`).
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from synclib.memory import run_in_child
from synclib.models import cache_dir, load_model

__all__ = ["ROWS", "PREFILL_TOKENS", "DECODE_STEPS", "RIDGE_SHAPE", "SPEED_FORMAT", "model_seconds", "ridge_seconds",
           "machine_key", "name", "measure", "timings"]

#: rows of the timed forwards (the loop's rows per forward on a CPU are of this order)
ROWS = 8
#: tokens per row of the timed prefill (a join or a passive read extends a cached prompt by about this many)
PREFILL_TOKENS = 96
#: one-token steps timed after the prefill
DECODE_STEPS = 12
#: the timed ridge grid: samples, layers (source and target), width; 3-fold CV over 40 groups (the default's)
RIDGE_SHAPE = (320, 16, 576)
#: the timings' format: another format measures again, and a calibration of another format is not compared
SPEED_FORMAT = 2


def _median(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


def model_seconds(spec: str, dtype: str, device: str = "cpu", repeats: int = 3) -> float:
    """Seconds of the timed forwards of model ``spec`` in ``dtype`` on ``device``: the median of ``repeats`` after
    one untimed warm-up, on this process' threads."""
    import torch

    lm = load_model(spec, dtype=dtype, device=device)
    ids = torch.randint(100, 5000, (ROWS, PREFILL_TOKENS), generator=torch.Generator().manual_seed(0))

    def once() -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            out = lm.model(input_ids=ids.to(lm.device), use_cache=True, logits_to_keep=1)
            nxt = ids[:, -1:].to(lm.device)
            for _ in range(DECODE_STEPS):
                out = lm.model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        return time.perf_counter() - t

    once()
    return _median([once() for _ in range(repeats)])


def ridge_seconds(repeats: int = 3) -> float:
    """Seconds of one CV ridge grid of :data:`RIDGE_SHAPE` (float32, this process' threads): the median of
    ``repeats`` after one untimed warm-up."""
    import numpy as np

    from synclib.analysis.ridge import r2_grid  # torch, only when timing

    n, layers, width = RIDGE_SHAPE
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, layers, width), dtype=np.float32)
    Y = (X[:, ::-1] @ rng.standard_normal((width, width), dtype=np.float32) / width ** 0.5
         + rng.standard_normal((n, layers, width), dtype=np.float32))
    train, test = np.arange(int(0.8 * n)), np.arange(int(0.8 * n), n)
    groups = np.arange(len(train)) * 40 // len(train)

    def once() -> float:
        t = time.perf_counter()
        r2_grid(X, Y, train, test, "cv", groups=groups)
        return time.perf_counter() - t

    once()
    return _median([once() for _ in range(repeats)])


#: environment variables that hold the libraries to fewer CPU instructions (e.g. to stand in for a laptop's CPU)
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "FBGEMM_ENABLE_INSTRUCTIONS")


def machine_key() -> str:
    """What a timing depends on besides the model and dtype: the CPU, its cores, torch's version, the threads asked
    for (``OMP_NUM_THREADS``; torch's default otherwise), the instructions the libraries are held to
    (:data:`ISA_LIMITS`), the format.  Without importing torch: the run's own process plans without it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "?"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = os.environ.get("OMP_NUM_THREADS") or "default"
    held = "".join(f"|{v}={os.environ[v]}" for v in ISA_LIMITS if os.environ.get(v))
    return f"{cpu}|{os.cpu_count()} cpus|torch {torch_version}|{threads} threads{held}|v{SPEED_FORMAT}"


def name(spec: str, dtype: str) -> str:
    """A model timing's name: ``spec@dtype``."""
    return f"{spec}@{dtype}"


def _names(items) -> list[str]:
    """The timings' names of ``items`` (``(spec, dtype)`` pairs, each once) and ``"ridge"``."""
    return [name(s, d) for s, d in dict.fromkeys(map(tuple, items))] + ["ridge"]


def measure(items) -> dict:
    """Time each of ``items``, ``(spec, dtype)`` pairs, and the ridge grid now: ``{name(spec, dtype): seconds,
    "ridge": seconds}``."""
    return _measure(_names(items))


def _measure(names: list[str]) -> dict:
    return {w: round(ridge_seconds() if w == "ridge" else model_seconds(*w.rsplit("@", 1)), 4) for w in names}


def _cache() -> Path:
    return cache_dir() / "speed.json"


def timings(items, log=None) -> dict:
    """:func:`measure` of ``items`` on this machine, each timing read from the cache where measured before, else
    measured in a child process (a message through ``log`` first) and kept."""
    path = _cache()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    mine = cache.setdefault(machine_key(), {})
    want = _names(items)
    todo = [w for w in want if w not in mine]
    if todo:  # in a child process: the models' memory is not left resident under the run's own
        if log is not None:
            log(f"timing {', '.join(todo)} on this machine (once; kept in {path})")
        mine.update(run_in_child(_measure, (todo,)))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    return {w: mine[w] for w in want}
