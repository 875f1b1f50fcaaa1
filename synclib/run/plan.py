"""What a run would do, without doing it (``synclib run --dry-run``).

For every job of the graph: whether it is up to date and, if not, why (its output is
missing, or which input changed since it last ran, or that an upstream job will run); the
disk its output will take and a time estimate where a benchmark result speaks to it.  The
estimates come from ``bench/results`` (:mod:`synclib.figures.benchmarks` quotes the same files); a job
no benchmark covers says so instead of guessing.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path


from synclib.analysis.sizing import EMBEDDED_SHAPES
from synclib.memory import GiB, available_bytes, session_budget
from synclib.models import cpu_has_native_bf16
from synclib.notebook import AT_ONCE
from synclib.paths import BENCH_RESULTS, display
from synclib.stamps import read_stamp
from synclib.tasks.scenarios import load_tasks, select_tasks

__all__ = ["JobPlan", "plan", "format_plan", "wall_seconds"]

#: input names that hold an upstream job's fingerprint (a change there is "upstream changed")
_UPSTREAM = {"cube", "manifest", "upstream", "notebooks", "pages"}


@dataclass
class JobPlan:
    """One job's line of the plan."""

    key: str
    output: str
    status: str            # "up to date" | "will run"
    reason: str            # why it will run ("" when up to date)
    disk_bytes: float | None = None
    seconds: float | None = None
    note: str = ""
    peak_gib: float | None = None  # peak resident memory (GiB) the measured run of this kind needed


def _short(v, n: int = 40) -> str:
    t = json.dumps(v, default=str)
    return t if len(t) <= n else t[:n - 3] + "..."


def _why(job, stamp: dict | None, running: set) -> str:
    upstream = [d for d in job.deps if d in running]
    if stamp is None:
        return "output missing" if not Path(job.output).exists() else "no finished stamp (interrupted?)"
    if stamp.get("fingerprint") == job.fp:
        return ""
    old = stamp.get("inputs")
    if not isinstance(old, dict):
        return "made by an older synclib (its inputs were not recorded)"
    changed = []
    for k in sorted(set(old) | set(job.inputs)):
        if old.get(k) != job.inputs.get(k):
            changed.append("upstream output changed" if k in _UPSTREAM else
                           f"{k}: {_short(old.get(k))} -> {_short(job.inputs.get(k))}")
    if upstream and all(c == "upstream output changed" for c in changed):
        return f"upstream job(s) {', '.join(upstream)} will run"
    return "; ".join(dict.fromkeys(changed)) or "fingerprint differs"


def _bench(name: str) -> dict | None:
    f = BENCH_RESULTS / name
    return json.loads(f.read_text()) if f.is_file() else None


#: the measured main job on the CPU (``bench/bench_main_job.py``): the rates the estimates scale
CALIBRATION = "main_job_cpu.json"


def simulate_work(cfg: dict) -> dict:
    """The utterances one ordered run of ``cfg`` plans: its genuine dialogs, the passive
    reader's reads and the ToM dialogs, each to ``max_utterances`` (an upper bound: dialogs
    end early), with the counts behind it."""
    sim = cfg["simulate"]
    n_tasks = len(select_tasks(load_tasks(cfg["scenarios"]), sim["episodes"]))
    seeds = len(sim["seeds"])
    dialogs = n_tasks * seeds
    passive = n_tasks * len(sim["passive_seeds"] or sim["seeds"]) if sim["passive"] else 0
    tom = min(n_tasks, sim["tom_episodes"] or n_tasks) * seeds if sim["tom"] else 0
    return {"tasks": n_tasks, "dialogs": dialogs, "passive_reads": passive, "tom_dialogs": tom,
            "planned": sim["max_utterances"] * (dialogs + passive + tom)}


def _dtype(cfg: dict) -> tuple[str, str]:
    """The compute dtype a CPU run of ``cfg`` gets, and why."""
    if cfg["dtype"] not in (None, "auto"):
        return cfg["dtype"], "set in the configuration"
    if cpu_has_native_bf16():
        return "bfloat16", "this CPU multiplies bfloat16 natively"
    return "float32", "this CPU lacks native bfloat16 (bfloat16 would be emulated)"


def _cpu_estimate(cfg: dict, job, cal: dict, work: dict) -> tuple[float | None, float | None, str]:
    """Seconds and peak resident GiB of one job on the CPU, scaled from the calibration
    (``work``: :func:`simulate_work` of ``cfg``)."""
    kind, _, name = job.key.partition(":")
    jobs = cal["jobs"]
    dtype, _ = _dtype(cfg)
    slower = 1.0
    if dtype != cal.get("dtype_used") and kind in ("simulate", "judge"):
        slower = (cal.get("dtypes") or {}).get("float32_factor", 1.0) if dtype == "float32" else 1.0
        slower = slower if cal.get("dtype_used") == "bfloat16" else 1 / slower
    if kind == "simulate":
        specs = (job.inputs["model_a"], job.inputs["model_b"])
        by = {tuple(v["specs"]): v for v in jobs["simulate"].values()}
        found = [by[k] for k in ([specs] if specs in by else [(s, s) for s in specs]) if k in by]
        if not found or (specs not in by and len(found) < 2):
            return None, None, ""
        rate = sum(v["seconds_per_utterance"] for v in found) / len(found) * slower
        peak = max(v.get("peak_rss_gib") or 0 for v in found) or None
        return rate * work["planned"], peak, (f"at most {work['planned']:,} utterances generated or read at "
                                             f"{1 / rate:.2g}/s, {dtype}")
    if kind == "judge":
        n = int(cfg["judge"]["sample"] or 0) or work["dialogs"]
        rates = [v["seconds_per_dialog"] for v in jobs["judge"].values() if v.get("seconds_per_dialog")]
        if not rates or cfg["judge"].get("url"):
            return None, None, ""
        return n * sum(rates) / len(rates) * slower, max(v.get("peak_rss_gib") or 0 for v in jobs["judge"].values()), ""
    if kind == "analyze":
        ref = list(jobs["analyze"].values())
        if not ref:
            return None, None, ""
        scale = (work["dialogs"] * len(cfg["analysis"]["split_seeds"])
                 / (ref[0]["dialogs"] * ref[0]["split_seeds"]))
        return (scale * sum(v["seconds"] for v in ref) / len(ref),
                max(v.get("peak_rss_gib") or 0 for v in ref), "")
    if kind == "notebook":
        nb = jobs["notebooks"]
        secs = nb.get(name, {}).get("seconds") or (sorted(v["seconds"] for v in nb.values())[len(nb) // 2] if nb else None)
        return secs, None, ""
    if kind in jobs:
        return jobs[kind]["seconds"], jobs[kind].get("peak_rss_gib"), ""
    return None, None, ""


def _simulate_estimate(cfg: dict, job, work: dict) -> tuple[float | None, float | None, str]:
    """Disk bytes and seconds of one simulate job on a GPU, from the latest measurement."""
    sim = cfg["simulate"]
    specs = (job.inputs["model_a"], job.inputs["model_b"])
    shapes = [EMBEDDED_SHAPES.get(s) for s in specs]
    disk = None
    if all(shapes):
        views = 1 + int(sim["passive"]) + int(sim["tom"])
        disk = work["dialogs"] * math.ceil(sim["max_utterances"] / 2) * views * sum(L * D for L, D in shapes) * 4.0
    utterances = work["planned"]
    if str(cfg["device"]).startswith("cuda"):
        g = _latest_gpu_rate()
        if g is not None:
            rate, what = g
            return disk, utterances / rate, f"at most {utterances:,} utterances at {rate:.2g}/s ({what})"
    return disk, None, f"at most {utterances:,} utterances; no benchmark for these models on this device"


def _latest_gpu_rate() -> tuple[float, str] | None:
    """The most recent measured utterances/s of the dialog loop on a GPU, and what was measured."""
    found = []
    for f in BENCH_RESULTS.glob("*cuda*.json"):
        d = json.loads(f.read_text())
        gpu = d.get("machine", {}).get("gpu", "a GPU")
        if d.get("benchmark") == "bench_simulate" and d.get("simulate", {}).get("utterances_per_s"):
            found.append((d.get("date", ""), d["simulate"]["utterances_per_s"], f"{f.name}, {gpu}"))
        if d.get("benchmark") == "scheduling":  # bench_scheduling.py: the dialog loop itself
            st = d.get("settings", {})
            for r in d.get("results", {}).values():
                for mode, m in r.get("modes", {}).items():
                    found.append((d.get("date", ""), m["utterances_per_s"],
                                  f"{f.name}: {mode} scheduling, {st.get('tasks')} tasks x "
                                  f"{len(st.get('seeds', [0]))} seed(s), {gpu}, {d.get('date', '')}"))
        for step in d.get("steps", []) if isinstance(d.get("steps"), list) else []:
            if isinstance(step, dict) and step.get("utterances_per_s"):
                found.append((d.get("date", ""), step["utterances_per_s"],
                              f"{f.name}: {step.get('label', 'dialog loop')}, {gpu}, {d.get('date', '')}"))
    if not found:
        return None
    date = max(f[0] for f in found)
    best = [f for f in found if f[0] == date][-1]
    return best[1], f"a 7B-shaped model: {best[2]}"


def plan(jobs: dict, cfg: dict) -> list[JobPlan]:
    """The plan of ``jobs`` (a graph from :func:`synclib.run.pipeline.build_jobs`), in run order."""
    running: set[str] = set()
    out = []
    cal = _bench(CALIBRATION) if not str(cfg["device"]).startswith("cuda") else None
    work = functools.cache(lambda: simulate_work(cfg))  # the task set is read once, when a job needs it
    for key, job in jobs.items():  # insertion order is a topological order
        why = _why(job, read_stamp(job.output), running)
        p = JobPlan(key, display(job.output), "will run" if why else "up to date", why)
        if why:
            running.add(key)
            if key.startswith("simulate:"):
                p.disk_bytes, p.seconds, p.note = _simulate_estimate(cfg, job, work())
            if cal is not None:
                secs, p.peak_gib, note = _cpu_estimate(cfg, job, cal, work())
                if secs is not None:
                    p.seconds, p.note = secs, note or p.note
        out.append(p)
    return out


def wall_seconds(estimates) -> float:
    """How long a local run of jobs with these ``(key, seconds)`` estimates takes: one job at
    a time, the notebooks :data:`synclib.notebook.AT_ONCE` at a time (their estimates are
    each notebook's time measured so, sharing the cores)."""
    pairs = [(k, v or 0) for k, v in estimates]
    notebooks = sum(v for k, v in pairs if k.startswith("notebook:"))
    return sum(v for k, v in pairs if not k.startswith("notebook:")) + notebooks / AT_ONCE


def plan_summary(rows: list[JobPlan]) -> str:
    """One line: how many jobs run, about how long they take and how much memory they need."""
    todo = [r for r in rows if r.status == "will run"]
    if not todo:
        return "every job is up to date"
    known = [r for r in todo if r.seconds is not None]
    text = f"{len(todo)} of {len(rows)} jobs will run"
    if known:
        text += (f"; about {duration_text(wall_seconds((r.key, r.seconds) for r in known))}"
                 + (f" for the {len(known)} with an estimate" if len(known) < len(todo) else ""))
    peaks = [r.peak_gib for r in todo if r.peak_gib]
    if peaks:
        text += f", peak memory about {max(peaks):.1f} GiB"
    return text


def _size(b: float | None) -> str:
    if b is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if b < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return "?"


def duration_text(secs: float) -> str:
    """A time to come, as a person says it: ``"5 s"`` (to 5 s) under 90 s, ``"12 min"``, ``"1.5 h"``
    from 90 minutes."""
    if secs < 90:
        return f"{max(5, 5 * round(secs / 5)):.0f} s"
    return f"{secs / 3600:.1f} h" if secs >= 5400 else f"{secs / 60:.0f} min"


def _minutes(secs: float) -> str:
    return "~" + duration_text(secs)


def format_plan(rows: list[JobPlan], cfg: dict | None = None) -> str:
    """The plan as text, one job per line, then the totals: disk, time (with the compute
    dtype it assumes) and memory (with what the machine has available)."""
    lines = []
    for r in rows:
        extra = ""
        if r.status == "will run" and (r.disk_bytes is not None or r.seconds is not None or r.note):
            est = []
            if r.disk_bytes is not None:
                est.append(f"~{_size(r.disk_bytes)}")
            if r.seconds is not None:
                est.append(_minutes(r.seconds))
            extra = f"  [{', '.join(est)}{'; ' if est and r.note else ''}{r.note}]"
        lines.append(f"{'RUN ' if r.status == 'will run' else 'ok  '} {r.key:34s} {r.output}"
                     + (f"\n       because {r.reason}" if r.reason else "") + extra)
    todo = [r for r in rows if r.status == "will run"]
    sims = [r for r in todo if r.key.startswith("simulate:")]
    disk = sum(r.disk_bytes or 0 for r in sims)
    unknown = sum(r.disk_bytes is None for r in sims)
    secs = wall_seconds((r.key, r.seconds) for r in todo)
    if not sims:
        writes = "no simulation"
    elif unknown == len(sims):
        writes = "simulation writes an amount not known before the models load (their shapes)"
    else:
        writes = f"simulation writes ~{_size(disk)}" + (f" plus {unknown} job(s) of unknown size" if unknown else "")
    missing = sum(r.seconds is None for r in todo)
    lines.append(f"{len(todo)} of {len(rows)} jobs would run; {writes}"
                 + (f"; the jobs take {_minutes(secs)} (estimated" if secs else "")
                 + (f"; {missing} job(s) without an estimate" if secs and missing else "") + (")" if secs else ""))
    if cfg is not None and todo and not str(cfg["device"]).startswith("cuda"):
        lines += _cpu_lines(cfg, todo, secs)
    return "\n".join(lines)


def _cpu_lines(cfg: dict, todo: list[JobPlan], secs: float) -> list[str]:
    """The time estimate's basis and the memory a CPU run expects."""
    cal = _bench(CALIBRATION)
    out = []
    dtype, why = _dtype(cfg)
    if cal is not None:
        m = cal["machine"]
        f32 = (cal.get("dtypes") or {}).get("float32_factor")
        basis = (f"time: the rates of {CALIBRATION} ({cal['date']}, {m['cpu_count']} cores of {m['cpu']}, "
                 f"{cal['dtype_used']}), computing in {dtype} ({why})")
        if dtype == "bfloat16" and f32 and cal.get("dtype_used") == "bfloat16":
            sim = sum(r.seconds or 0 for r in todo if r.key.split(":")[0] in ("simulate", "judge"))
            basis += f"; in float32 (a CPU without native bfloat16) {_minutes(secs + (f32 - 1) * sim)}"
        out.append(basis)
    peaks = [r.peak_gib for r in todo if r.peak_gib]
    avail = available_bytes()
    budget = session_budget(cfg["simulate"].get("cache_gib", "auto"))
    mem = f"memory: the session caches may hold {budget / GiB:.1f} GiB"
    if cfg["simulate"].get("cache_gib", "auto") == "auto" and avail is not None:
        mem += f" (a quarter of the {avail / GiB:.1f} GiB available now, 0.25-4 GiB)"
    if peaks:
        mem += f"; the measured run of these jobs peaked at {max(peaks):.1f} GiB resident"
        if avail is not None and max(peaks) * GiB > avail:
            mem += (" - more than is available now: close programs or lower simulate.max_rows "
                    "(or simulate.units_per_part)")
    out.append(mem)
    return out
