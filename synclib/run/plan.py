"""What a run would do, without doing it (``synclib run --dry-run``).

For every job of the graph: whether it is up to date and, if not, why (output missing, an input changed, an
upstream job will run); the disk its output will take and a time estimate from ``bench/results`` where a
benchmark speaks to it (a job no benchmark covers says so instead of guessing).
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path


from synclib.cluster import duration_text as cluster_duration
from synclib.cluster import parse_duration, spec_of
from synclib.memory import GiB, available_bytes, session_budget
from synclib.models import cpu_has_native_bf16
from synclib.notebook import AT_ONCE
from synclib.paths import display
from synclib.run import price, speed
from synclib.shapes import model_shape
from synclib.simulate.options import default_units_per_part
from synclib.stamps import read_stamp
from synclib.tasks.scenarios import count_tasks

__all__ = ["JobPlan", "plan", "format_plan", "price_lines", "wall_seconds", "machine_ratios", "timed_items"]

#: input names that hold an upstream job's fingerprint (a change there is "upstream changed")
_UPSTREAM = {"cube", "manifest", "claims", "upstream", "notebooks"}


@dataclass
class JobPlan:
    """One job's line of the plan."""

    key: str
    output: str
    status: str            # "up to date" | "will run" | "not done" (a step not run now, not done before)
    reason: str            # why it will run ("" when up to date)
    disk_bytes: float | None = None
    seconds: float | None = None
    note: str = ""
    peak_gib: float | None = None  # peak resident memory (GiB) the measured run of this kind needed
    gpu_gib: float | None = None   # GPU memory the job needs (CUDA configs: weights + key/value cache)
    host_gib: float | None = None  # host memory the job needs (CUDA configs: the analysis' rows)
    variable_gib: float | None = None  # the analysis' largest hidden variable (GiB)
    requests: int | None = None    # requests a judge job sends to its endpoint
    gpu: bool = False              # the job asks for a GPU (dask resource GPU=1)
    sim: object = None             # a simulation's price (synclib.run.price.SimPrice)
    judge: dict | None = None      # a judge job's price (synclib.run.price.price_judge)


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


#: the measured main job on the CPU (``bench/bench_main_job.py``): the rates the estimates scale
CALIBRATION = "main_job_cpu.json"


def simulate_work(cfg: dict) -> dict:
    """The utterances one ordered run plans (``planned``: genuine dialogs, passive reads and ToM dialogs, each to
    ``max_utterances``, an upper bound), with the counts behind it."""
    sim = cfg["simulate"]
    n_tasks = count_tasks(cfg["scenarios"], sim["episodes"])
    seeds = len(sim["seeds"])
    dialogs = n_tasks * seeds
    passive = n_tasks * len(sim["passive_seeds"] or sim["seeds"]) * (1 + int(sim["passive_own"])) if sim["passive"] else 0
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


def _local_judge(cfg: dict) -> str | None:
    """The spec of a config's local judge (None: an endpoint)."""
    judge = cfg["judge"]
    return judge["model"] if judge.get("model") and not judge.get("url") else None


def _pair_specs(cfg: dict) -> list[str]:
    """The specs of the models the config's pairs play, in the order of ``models``."""
    used = {m for p in cfg["pairs"] for m in p.split("-")}
    return [cfg["models"][m]["spec"] for m in cfg["models"] if m in used]


def timed_items(cfg: dict, dtype: str) -> list[tuple[str, str]]:
    """What a CPU run of ``cfg`` is timed on (:mod:`synclib.run.speed`): each model of its pairs in ``dtype`` (the
    one its simulations compute in) and a local judge in float32 (its dtype on a CPU); here and where the
    calibration is measured (``bench/bench_main_job.py``)."""
    judge = _local_judge(cfg)
    return [(s, dtype) for s in _pair_specs(cfg)] + ([(judge, "float32")] if judge else [])


def machine_ratios(cfg: dict, cal: dict | None, log=print) -> dict | None:
    """How many times longer each model of the pairs (by spec, in the dtype the run will use against the
    calibration's), the local judge (``"judge"``, float32 on both) and the analysis (``"ridge"``) take on this
    machine than where the calibration was measured (:mod:`synclib.run.speed`); None for a CUDA config, a
    calibration without timings of this format, or models that cannot be timed here (a hub id not downloaded)."""
    there = (cal or {}).get("speed")
    if not there or _is_cuda(cfg) or there.get("format") != speed.SPEED_FORMAT:
        return None
    dtype, _ = _dtype(cfg)
    sims, judge = _pair_specs(cfg), _local_judge(cfg)
    try:
        here = speed.timings(timed_items(cfg, dtype), log=log)
    except Exception as exc:  # noqa: BLE001 - any failure only loses the machine's scaling
        log(f"could not time this machine ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); the "
            f"estimates are the calibration machine's")
        return None
    t, cdt = there["timings"], there["dtype"]
    pairs = {s: (speed.name(s, dtype), speed.name(s, cdt)) for s in sims}
    if judge:
        pairs["judge"] = (speed.name(judge, "float32"),) * 2
    pairs["ridge"] = ("ridge", "ridge")
    return {k: here[a] / t[b] for k, (a, b) in pairs.items() if t.get(b)}


def _slower(cfg: dict, job, kind: str, cal: dict, ratios: dict | None) -> float:
    """How many times longer a simulate, judge or analyze job takes here than in the calibration: this machine's
    timings over the calibration's (``ratios``, :func:`machine_ratios`), or without them the calibration's float32
    factor where the dtypes differ."""
    if ratios:
        if kind == "simulate":
            got = [ratios.get(job.inputs[k]) for k in ("model_a", "model_b")]
        elif kind == "judge":
            got = [ratios.get("judge")]
        else:
            got = [ratios.get("ridge")]
        if all(got):
            return sum(got) / len(got)
    dtype, _ = _dtype(cfg)
    if dtype == cal.get("dtype_used") or kind not in ("simulate", "judge"):
        return 1.0
    f32 = (cal.get("dtypes") or {}).get("float32_factor", 1.0) if dtype == "float32" else 1.0
    return f32 if cal.get("dtype_used") == "bfloat16" else 1 / f32


def _cpu_estimate(cfg: dict, job, cal: dict, work: dict, ratios: dict | None = None
                  ) -> tuple[float | None, float | None, str]:
    """Seconds, peak resident GiB and a note for one job on the CPU, scaled from the calibration (and to this
    machine by ``ratios``, :func:`machine_ratios`)."""
    kind, _, name = job.key.partition(":")
    jobs = cal["jobs"]
    dtype, _ = _dtype(cfg)
    slower = _slower(cfg, job, kind, cal, ratios) if kind in ("simulate", "judge", "analyze") else 1.0
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
                 / (ref[0]["dialogs"] * ref[0]["split_seeds"])) * slower
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
    """Disk bytes of one simulate job on the CPU (its seconds come from the measured main job)."""
    shapes = [model_shape(s) for s in (job.inputs["model_a"], job.inputs["model_b"])]
    disk = price.cube_bytes(cfg, work, shapes) if all(shapes) else None
    return disk, None, f"at most {work['planned']:,} utterances; no benchmark for these models on this device"


def _is_cuda(cfg: dict) -> bool:
    return str(cfg["device"]).startswith("cuda")


def _gpu_estimate(cfg: dict, job, p: JobPlan, work: dict, cal: dict | None, ref) -> None:
    """Fill ``p`` for a job of a CUDA config (GPU jobs priced on ``ref``'s card, CPU jobs from the main job's)."""
    kind, _, name = job.key.partition(":")
    if kind == "simulate":
        _priced_simulation(cfg, job, p, work, ref)
    elif kind == "analyze":
        specs = tuple(cfg["models"][k]["spec"] for k in name.split("-"))  # a run's name is "A-B"
        a = price.price_analysis(cfg, specs, work, ref.card if ref else "")
        p.seconds, p.note, p.gpu_gib = a["seconds"], a["note"], a["gpu_gib"]
        p.host_gib = None if a["host_bytes"] is None else a["host_bytes"] / GiB
        p.variable_gib = None if a["variable_bytes"] is None else a["variable_bytes"] / GiB
    elif kind == "judge":
        j = p.judge = price.price_judge(cfg, work)
        p.requests = j["requests"]
        p.note = (f"{j['requests']:,} requests ({j['what']}); the time depends on your endpoint"
                  if j["url"] else f"{j['requests']:,} questions to the local judge; no GPU judge rate measured")
    elif cal is not None:
        secs, p.peak_gib, note = _cpu_estimate(cfg, job, cal, work)
        if secs is not None:
            p.seconds, p.note = secs, f"on the CPU, as measured in {CALIBRATION} (the embedded run's results)"


def _priced_simulation(cfg: dict, job, p: JobPlan, work: dict, ref) -> None:
    """Fill ``p`` for a simulation job priced from ``ref``."""
    sp = p.sim = price.price_simulation(cfg, (job.inputs["model_a"], job.inputs["model_b"]), work, ref)
    p.seconds, p.note, p.disk_bytes = sp.seconds, sp.note, sp.disk
    p.gpu_gib = sp.gpu_gib if _is_cuda(cfg) else None


def plan(jobs: dict, cfg: dict, ratios: dict | None = None) -> list[JobPlan]:
    """The plan of ``jobs``, in run order; a CPU config's simulations priced from its own ``synclib bench``
    record where it has one, the other CPU estimates scaled to this machine by ``ratios`` (:func:`machine_ratios`;
    None: the calibration machine's times)."""
    running: set[str] = set()
    out = []
    cuda = _is_cuda(cfg)
    cal = price.load_bench(CALIBRATION)
    ref = price.reference(cfg)
    work = functools.cache(lambda: simulate_work(cfg))  # the task set is read once, when a job needs it
    for key, job in jobs.items():  # insertion order is a topological order
        why = _why(job, read_stamp(job.output), running)
        if job.check_only:  # a step this run does not run: done before, or the run cannot start
            out.append(JobPlan(key, display(job.output), "not done" if why else "up to date",
                               "its step is not among --steps, and it must be done first" if why else "",
                               gpu=bool(job.gpu)))
            continue
        p = JobPlan(key, display(job.output), "will run" if why else "up to date", why, gpu=bool(job.gpu))
        if why:
            running.add(key)
            if cuda:
                _gpu_estimate(cfg, job, p, work(), cal, ref)
                out.append(p)
                continue
            if key.startswith("simulate:"):
                p.disk_bytes, p.seconds, p.note = _simulate_estimate(cfg, job, work())
            if cal is not None:
                secs, p.peak_gib, note = _cpu_estimate(cfg, job, cal, work(), ratios)
                if secs is not None:
                    p.seconds, p.note = secs, note or p.note
            if key.startswith("simulate:") and ref is not None:  # this run's own measurement
                peak = p.peak_gib
                _priced_simulation(cfg, job, p, work(), ref)
                p.peak_gib = peak
        out.append(p)
    return out


def wall_seconds(estimates) -> float:
    """Seconds a local run of ``(key, seconds)`` estimates takes: one job at a time, the notebooks
    :data:`synclib.notebook.AT_ONCE` at a time (each estimate measured so, sharing the cores)."""
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
    """A time to come: ``"5 s"`` (to 5 s) under 90 s, ``"12 min"``, ``"1.5 h"`` from 90 minutes."""
    if secs < 90:
        return f"{max(5, 5 * round(secs / 5)):.0f} s"
    return f"{secs / 3600:.1f} h" if secs >= 5400 else f"{secs / 60:.0f} min"


def _minutes(secs: float) -> str:
    return "~" + duration_text(secs)


def format_plan(rows: list[JobPlan], cfg: dict | None = None, scheduler: dict | None = None,
                config_path: str | None = None, n_runs: int | None = None, ratios: dict | None = None) -> str:
    """The plan as text, one job per line, then the totals; a CUDA config gets :func:`price_lines` (``scheduler``:
    :func:`synclib.run.price.check_scheduler`'s answer with its ``address``) and how it runs on SLURM (its
    ``cluster:`` block, or :func:`array_lines` for ``config_path`` and its ``n_runs`` ordered runs); a CPU config
    the basis of its times (``ratios``: :func:`machine_ratios`, as :func:`plan` used them)."""
    lines = []
    cuda = cfg is not None and _is_cuda(cfg)
    ref = price.reference(cfg) if cuda else None
    on = f" on {ref.card}" if ref else ""
    for r in rows:
        extra = ""
        if r.status == "will run" and (r.disk_bytes is not None or r.seconds is not None or r.note):
            est = []
            if r.disk_bytes is not None:
                est.append(f"~{_size(r.disk_bytes)}" + (" disk" if cuda else ""))
            if r.seconds is not None:
                est.append(f"~{r.seconds / 3600:.2f} GPU-hours{on}" if cuda and r.gpu_gib is not None
                           else _minutes(r.seconds))
            if r.gpu_gib is not None:
                est.append(f"GPU memory ~{r.gpu_gib:.1f} GiB")
            if r.host_gib is not None:
                est.append(f"host memory ~{r.host_gib:.1f} GiB")
            extra = f"  [{', '.join(est)}{'; ' if est and r.note else ''}{r.note}]"
        tag = {"will run": "RUN ", "not done": "MISS"}.get(r.status, "ok  ")
        lines.append(f"{tag} {r.key:34s} {r.output}"
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
    missing = [r for r in todo if r.seconds is None]
    judges = [r for r in missing if r.requests is not None]
    why = ""
    if missing:
        why = f"; {len(missing)} job(s) without an estimate"
        if judges:
            why += (f" ({len(judges)} judge job(s): {sum(r.requests for r in judges):,} requests, their time "
                    f"depends on the endpoint" + (")" if len(judges) == len(missing) else
                                                 f"; {len(missing) - len(judges)} with no measurement)"))
    lines.append(f"{len(todo)} of {len(rows)} jobs would run; {writes}"
                 + (f"; the jobs take {_minutes(secs)} (estimated" if secs else "")
                 + (why if secs else "") + (")" if secs else ""))
    missing = [r for r in rows if r.status == "not done"]
    if missing:
        lines.append(f"{len(missing)} job(s) of steps not run now are not done (MISS): the run would refuse to start")
    if cfg is not None and todo and not cuda:
        lines += _cpu_lines(cfg, todo, secs, ratios)
    if cfg is not None and cuda:
        lines += price_lines(cfg, rows, scheduler)
    elif scheduler is not None:
        lines.append("cluster: " + _cluster_text(scheduler, [], 0).lstrip("; "))
    if cfg is not None and cfg.get("cluster"):
        lines += _cluster_lines(cfg, rows)
    elif cuda:
        lines += array_lines(cfg, rows, config_path or "CONFIG", n_runs)
    return "\n".join(lines)


#: the job array of the reproduce page: one ordered run per task
ARRAY_SCRIPT = Path("config") / "slurm" / "runs.sbatch"


def array_lines(cfg: dict, rows: list[JobPlan], config_path: str = "CONFIG", n_runs: int | None = None) -> list[str]:
    """How a GPU config runs as :data:`ARRAY_SCRIPT`'s job array, and how often its longest simulation requeues."""
    from synclib.paths import REPO_ROOT  # the template ships in the checkout

    script = REPO_ROOT / ARRAY_SCRIPT
    if not script.is_file():
        return []
    n = n_runs or len({r.key.split(":", 1)[1] for r in rows if r.key.startswith("simulate:")})
    directives = re.findall(r"^#SBATCH\s+(\S.*)$", script.read_text(), flags=re.M)
    conf = config_path
    out = [f"on SLURM as a job array ({ARRAY_SCRIPT}; book: reproduce, \"On a cluster\"): "
           f"mkdir -p logs && sbatch --array=0-{max(n - 1, 0)}%8 {ARRAY_SCRIPT} {conf}",
           f"  each task runs: synclib run --config {conf} --runs $SLURM_ARRAY_TASK_ID --steps simulate,analyze "
           "(then --steps judge once the judge is served, and --steps notebooks,book once every run is in)",
           "  its job script asks for: " + " ".join(directives)]
    wall = next((d.split("=", 1)[1] for d in directives if d.startswith("--time=")), None)
    sims = [r.seconds for r in rows if r.status == "will run" and r.key.startswith("simulate:") and r.seconds]
    if wall and sims:
        limit = parse_duration(wall, "--time") - 300  # it requeues itself five minutes before
        longest = max(sims)
        out.append(f"  the longest simulation takes ~{hours_text(longest / 3600)} h: within --time={wall} it requeues "
                   f"itself about {math.ceil(longest / limit) - 1} time(s), resuming from its parts"
                   if longest > limit else f"  the longest simulation takes ~{hours_text(longest / 3600)} h, within "
                   f"--time={wall}")
    out.append("  or give the config a cluster: block (type: slurm, jobs, walltime, cores, memory) to run the grid from "
               "one synclib run: the dry run then prints the job script dask-jobqueue would submit")
    return out


def _cluster_lines(cfg: dict, rows: list[JobPlan]) -> list[str]:
    """The config's cluster, the grid's wall time on it, whether a worker outlives a cube part, its job script."""
    spec = spec_of(cfg)
    out = spec.describe()
    if spec.type is None:
        return out
    todo = [r for r in rows if r.status == "will run"]
    gpu_jobs = [r for r in todo if r.gpu and r.seconds]
    if gpu_jobs and spec.gpus:
        total = sum(r.seconds for r in gpu_jobs)
        longest = max(r.seconds for r in gpu_jobs)
        out.append(f"  wall time ~{hours_text(max(total / spec.jobs, longest) / 3600)} h with {spec.jobs} GPU job(s) at "
                   f"once (GPU-hours / jobs, at least the longest job, {hours_text(longest / 3600)} h)")
    sims = [r for r in todo if r.key.startswith("simulate:") and r.seconds]
    if sims and spec.lifetime is not None:
        part = max(r.seconds / max(1, _parts(cfg)) for r in sims)
        if part > 0.8 * spec.lifetime:
            out.append(f"  WARNING: one cube part takes up to ~{duration_text(part)} and a worker lives "
                       f"{cluster_duration(spec.lifetime)}: a worker that leaves mid-part loses that part, so a "
                       "simulation could never finish; raise cluster.walltime or lower simulate.units_per_part")
        else:
            out.append(f"  a cube part takes up to ~{duration_text(part)}, well inside a worker's lifetime: a worker that "
                       "leaves loses at most the part it was playing")
    script = spec.job_script()
    if script:
        out.append("  the job script of each worker (the scheduler's address filled in at submission):")
        out += ["    " + line for line in script.strip().splitlines()]
    return out


def _parts(cfg: dict) -> int:
    """The cube parts of one ordered run (units per part as configured, 64 on a GPU)."""
    sim = cfg["simulate"]
    units = simulate_work(cfg)["dialogs"]
    return math.ceil(units / (sim["units_per_part"] or default_units_per_part(cfg["device"])))


def hours_text(h: float) -> str:
    """GPU-hours as the price prints them: whole hours from 10, else one or two decimals."""
    return f"{h:,.0f}" if h >= 10 else f"{h:.1f}" if h >= 1 else f"{h:.2f}"


def _range(vals, fmt) -> str:
    lo, hi = min(vals), max(vals)
    return fmt(hi) if math.isclose(lo, hi, rel_tol=5e-3) else f"{fmt(lo)}-{fmt(hi)}"


def price_lines(cfg: dict, rows: list[JobPlan], scheduler: dict | None = None) -> list[str]:
    """The price of a CUDA config's jobs that will run (:mod:`synclib.run.price`)."""
    todo = [r for r in rows if r.status == "will run"]
    out = ["price (each number from the measurement it names; the simulations' utterances are an upper bound: "
           "every dialog to simulate.max_utterances):"]
    ref = price.reference(cfg)
    card = ref.card if ref else "a GPU"
    sims = [r for r in todo if r.key.startswith("simulate:")]
    anas = [r for r in todo if r.key.startswith("analyze:")]
    judges = [r for r in todo if r.key.startswith("judge:")]
    out += _simulation_lines(cfg, sims, ref)
    if anas:
        out += _analysis_lines(cfg, anas, card)
    if judges:
        out += _judge_lines(cfg, judges)
    out += _memory_lines(cfg, sims, ref)
    disks = [r.disk_bytes for r in sims if r.disk_bytes is not None]
    if disks:
        per_run = _range([d / GiB for d in disks], lambda g: f"{g:.1f}")
        out.append(f"disk: ~{per_run} GiB per run, ~{_size(sum(disks))} in all for {len(disks)} runs (the cubes' hidden "
                   f"states uncompressed in {cfg['simulate']['store_dtype']}: dialogs + passive reads + ToM dialogs x "
                   f"rounds x layers x width of both models; zlib keeps most of it)")
    out += price.logins(cfg)
    gpu_jobs = [r for r in todo if (r.gpu or r.key.startswith("analyze:")) and r.seconds]
    total_h = sum(r.seconds for r in gpu_jobs) / 3600
    if gpu_jobs:
        out.append(f"total: ~{hours_text(total_h)} GPU-hours on {card} ({len(gpu_jobs)} jobs on a GPU, one GPU each)"
                   + _cluster_text(scheduler, gpu_jobs, total_h))
    elif scheduler is not None:
        out.append(_cluster_text(scheduler, [], 0).lstrip("; "))
    if sims and ref is not None:
        out += price.assumptions(cfg, ref)
    return out


def _simulation_lines(cfg: dict, sims: list[JobPlan], ref) -> list[str]:
    """The simulations' GPU-hours and where they come from."""
    if not sims:
        return []
    if ref is None:
        return [f"{len(sims)} simulations: no measured dialog loop on a GPU in bench/results: no GPU-hours"]
    dtype = price.compute_dtype(cfg)
    conv = ""
    if dtype != ref.dtype:
        pr = price.prefill_dtype_ratio()
        conv = (f", {ref.dtype} -> {dtype} x{price.DTYPE_BYTES[dtype] / price.DTYPE_BYTES.get(ref.dtype, 2):g} "
                f"decoding" + (f" / x{pr[0] if dtype == 'float32' else 1 / pr[0]:.2f} prefill (measured)" if pr else ""))
    priced = [r for r in sims if r.seconds is not None]
    sim_h = sum(r.seconds or 0 for r in sims) / 3600
    shape = (f"a {ref.params / 1e9:.2f}B-parameter {ref.layers}x{ref.width} shape"
             + (" (Mistral-7B's)" if (ref.layers, ref.width, ref.params) == (32, 4096, 7_241_732_096) else ""))
    unfit = [r for r in sims if r.sim is not None and r.sim.fits is False]
    return [f"{len(sims)} simulations: ~{hours_text(sim_h)} GPU-hours on {ref.card} (from {ref.file}, {ref.date}, "
            f"{ref.gpu}; rate {ref.rate:.2f} utterances/s, {shape}, {ref.dtype}{conv}); "
            + (f"per job {_range([r.seconds / 3600 for r in priced], hours_text)} h" if priced else "no job priced")
            + (f"; {len(sims) - len(priced) - len(unfit)} job(s) of unknown shape not priced"
               if len(priced) + len(unfit) < len(sims) else "")
            + (f"; {len(unfit)} job(s) that do not fit the card not priced" if unfit else "")] \
        + price.price_basis(cfg, ref)


def _analysis_lines(cfg: dict, anas: list[JobPlan], card: str) -> list[str]:
    """The analyses' GPU-hours and memory."""
    ana_h = sum(r.seconds or 0 for r in anas) / 3600
    note = next((r.note for r in anas if r.note), "")
    out = [f"{len(anas)} analyses: ~{hours_text(ana_h)} GPU-hours on {card}, the ridge grids only ({note}); not "
           "counted, not measured at paper scale: reading the cube, surrogates, planted differences, relationship, MLP, "
           "ToM probes"]
    host = [r.host_gib for r in anas if r.host_gib is not None]
    gpu = [r.gpu_gib for r in anas if r.gpu_gib is not None]
    if host:
        ana = cfg["analysis"]
        var = max(r.variable_gib or 0 for r in anas)
        stream = price.load_bench("analysis_stream_cpu.json")
        out.append(f"  analysis memory: host ~{max(host):.1f} GiB (each fit's rows: {ana['n_samples'] or 'all'} samples x "
                   f"both models' layers x width in float32, + hidden variables up to analysis.max_resident_gib "
                   f"{ana['max_resident_gib']} GiB held whole; these runs' are up to {var:.1f} GiB each"
                   + (", so they stream from disk" if var > ana["max_resident_gib"] else "") + ")"
                   + (f"; measured: a streamed grid at the 7B shape peaked at {stream['analysis']['peak_rss_gib']} GiB "
                      f"resident (analysis_stream_cpu.json, {stream['shape']['episodes']} tasks x "
                      f"{stream['shape']['seeds']} seeds)" if stream and "analysis" in stream else "")
                   + (f"; GPU ~{max(gpu):.1f} GiB (the ridge benchmark's peak)" if gpu else ""))
    return out


def _judge_lines(cfg: dict, judges: list[JobPlan]) -> list[str]:
    """The judge's requests and tokens (its time depends on the endpoint)."""
    n = sum(r.requests or 0 for r in judges)
    jd = cfg["judge"]
    if not jd["url"]:
        return [f"{len(judges)} judge jobs: {n:,} questions to the local judge {jd['model']} on the GPU "
                "(no GPU judge rate measured)"]
    j = judges[0].judge or {}
    out = [f"{len(judges)} judge jobs: {n:,} requests to {jd['url']} ({jd['model']}; {j.get('what', '')}), "
           f"{jd['concurrency']} in flight: the time depends on your endpoint (no HTTP judge throughput is measured "
           "in bench/results)"]
    if "input_tokens" in j:
        tin = sum((r.judge or {}).get("input_tokens", 0) for r in judges)
        tout = sum((r.judge or {}).get("output_tokens", 0) for r in judges)
        out.append(f"  judge tokens: at most ~{tin / 1e6:,.0f}M input and ~{tout / 1e6:,.0f}M output tokens in all "
                   f"({j['tokens_note']})")
    return out


def _memory_lines(cfg: dict, sims: list[JobPlan], ref) -> list[str]:
    """What a simulation job holds on its card: the weights and the keys/values of the rows that fit."""
    mem = [r for r in sims if r.sim is not None and r.sim.kv_row is not None]
    if not mem:
        return []
    dtype = price.compute_dtype(cfg)
    sim = cfg["simulate"]
    prompt, src = price.prompt_tokens(ref)
    first = mem[0].sim
    worst = max(mem, key=lambda r: r.gpu_gib or 0)
    limit = ref.gpu_gib if ref and ref.gpu_gib else None
    cache = ("simulate.cache_gib auto: what the GPU can give beyond a tenth of its memory" if sim["cache_gib"] == "auto"
             else f"simulate.cache_gib {sim['cache_gib']} GiB")
    out = [f"GPU memory per simulation job: up to {worst.gpu_gib:.1f} GiB ({worst.key[9:]}): the weights of both "
           f"models ({dtype}) + the key/value cache of {first.rows_configured} rows ({first.rows_what}) x "
           f"({prompt:,} + {sim['max_new_tokens']}) tokens ({src}), or of as many rows as fit "
           + (f"{price.CARD_SHARE:.0%} of the {limit:.1f} GiB {ref.card}" if limit else "the card")
           + f"; the session caches take what is left ({cache})"]
    fewer = [r for r in mem if r.sim.fits and r.sim.rows < r.sim.rows_configured]
    unfit = [r for r in mem if r.sim.fits is False]
    if fewer:
        by = sorted(fewer, key=lambda r: r.sim.rows)
        out.append(f"  {len(fewer)} of {len(mem)} jobs fit fewer rows and are priced so (the engine halves a batch "
                   "that runs out of memory; below the measured rows per step, fewer rows take more steps): "
                   + ", ".join(f"{r.key[9:]} {r.sim.rows}" for r in by[:8]) + (", ..." if len(by) > 8 else "")
                   + " rows; bfloat16 (dtype) or a larger card fits more")
    if unfit:
        out.append(f"  ERROR: {len(unfit)} job(s) do not fit the card even at one row: "
                   + ", ".join(r.key[9:] for r in unfit[:8]) + f" ({unfit[0].note})")
    elif limit:
        out.append(f"  every simulation job fits the {ref.card} as configured: weights + the rows priced "
                   f"<= {price.CARD_SHARE * limit:.1f} GiB")
    return out


def _cluster_text(scheduler: dict | None, gpu_jobs: list[JobPlan], total_h: float) -> str:
    if scheduler is None:
        return ""
    addr = scheduler.get("address", "the scheduler")
    if not scheduler.get("ok"):
        return f"; scheduler {addr} does not answer ({scheduler.get('error', '')}): no wall time on it"
    w, g = scheduler["workers"], scheduler["gpu_workers"]
    text = f"; scheduler {addr} answers: {w} worker(s), {g} with resource GPU"
    if not g:
        return text + " (start GPU workers with --resources GPU=1: the GPU jobs wait for one)"
    longest = max(r.seconds for r in gpu_jobs) / 3600 if gpu_jobs else 0
    wall = max(total_h / g, longest)
    return text + (f": wall time ~{hours_text(wall)} h with {g} GPU worker(s) (GPU-hours / workers, at least the "
                   f"longest job, {hours_text(longest)} h)")


def _cpu_lines(cfg: dict, todo: list[JobPlan], secs: float, ratios: dict | None = None) -> list[str]:
    """The time estimate's basis and the memory a CPU run expects."""
    cal = price.load_bench(CALIBRATION)
    out = []
    dtype, why = _dtype(cfg)
    ref = price.reference(cfg)
    if ref is not None and any(r.key.startswith("simulate:") for r in todo):
        out.append(f"time of the simulations: from this run's own measurement, {ref.describe()} (synclib bench), "
                   "scaled per model")
    if cal is not None:
        m = cal["machine"]
        f32 = (cal.get("dtypes") or {}).get("float32_factor")
        basis = (f"time: the rates of {CALIBRATION} ({cal['date']}, {m['cpu_count']} cores of {m['cpu']}, "
                 f"{cal['dtype_used']}), computing in {dtype} ({why})")
        if ratios:
            names = {"ridge": "the analysis", "judge": "the judge"}
            basis += ("; scaled to this machine by its own timed forwards (synclib.run.speed), here over there: "
                      + ", ".join(f"{names.get(k, k)} {v:.2g}x" for k, v in ratios.items()))
        elif dtype == "bfloat16" and f32 and cal.get("dtype_used") == "bfloat16":
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
