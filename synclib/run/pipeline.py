"""The main job: one config -> simulate, judge, analyse, judge the claims, execute notebooks, build the book.

A run is a graph of jobs, one per (model pair, step), plus the claims, the notebooks and the book:

    simulate[pair] --> judge[pair]   --.
                  \--> analyze[pair] --+--> manifest --> claims --> notebook[i] --> book

Dask runs it in-process, one job after the other (``scheduler: sync``, the default), or with ``--scheduler
ADDRESS`` or a config ``cluster:`` section on a ``dask.distributed`` cluster, where jobs that need a GPU ask for
the worker resource ``GPU=1`` (start GPU workers with ``--resources GPU=1``).  A job is skipped when its output's
stamp (``*.done.json``) holds the same fingerprint of its inputs; a simulation resumes an interrupted cube, so a
retried job loses nothing written.  The command line is :mod:`synclib.cli.run`.
"""
from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from synclib import __version__, config
from synclib.cluster import ClusterSpec
from synclib.analysis import ANALYSIS_FORMAT
from synclib.config import STEPS, ConfigError, keys_of_step
from synclib.tasks.datasets import TASK_SETS
from synclib.cube import StalePartsError, open_cube, parts_dir
from synclib.paths import (BENCH_RESULTS, BUILD_DIR, CLAIMS_FILE, EXECUTED_DIR, PAPER_CONFIG, PUBLISHED_NUMBERS,
                           REPO_ROOT, display)
from synclib.memory import PeakRSS, release_free_memory, run_in_child
from synclib.models import EMBEDDED
from synclib.notebook import AT_ONCE, NotebookFailed, failure, figure_notebooks, synclib_imports
from synclib.run.plan import duration_text, plan, price_lines, wall_seconds
from synclib.simulate import Batching, Passes, RunOptions, Sampling, simulate
from synclib.stamps import mark_done, output_lock, read_stamp, stamp_path, up_to_date
from synclib.tasks.scenarios import load_tasks, select_tasks



@dataclass(frozen=True)
class Run:
    """One ordered run ``name`` = ``"A-B"`` (cube ``cubes/A-B.nc``): model ``a`` plays agent 1, ``b`` agent 2;
    ``pair`` is the configured (unordered) pair, ``order`` 1 as written and 2 reversed."""

    name: str
    pair: str
    a: str
    b: str
    order: int


def runs(cfg: dict) -> list[Run]:
    """The ordered runs of a config: each pair as written, and reversed when ``orders`` is
    ``both`` and its two models differ (the paper's 36 ordered runs of 21 pairs)."""
    out = []
    for pair in cfg["pairs"]:
        a, b = pair.split("-")
        out.append(Run(pair, pair, a, b, 1))
        if cfg["orders"] == "both" and a != b:
            out.append(Run(f"{b}-{a}", pair, b, a, 2))
    return out


def select_runs(cfg: dict, chosen) -> list[Run]:
    """The ordered runs named in ``chosen`` (``"A-B"`` names, or positions in :func:`runs`, 0 first: an array
    job's task id), in the config's order, each once.  Raises ``ConfigError`` naming an unknown name (and the
    nearest one) or a position out of range."""
    import difflib

    every = runs(cfg)
    names = [r.name for r in every]
    picked = set()
    for item in chosen:
        item = str(item).strip()
        if item.isdigit():
            if int(item) >= len(every):
                raise ConfigError(f"--runs: position {item} is out of range: the config has {len(every)} ordered "
                                  f"runs (0-{len(every) - 1}; `synclib run --list-runs` lists them)")
            picked.add(names[int(item)])
        elif item in names:
            picked.add(item)
        else:
            close = difflib.get_close_matches(item, names, n=1, cutoff=0.5)
            raise ConfigError(f"--runs: {item!r} is not an ordered run of this config"
                              + (f" (did you mean {close[0]!r}?)" if close else "")
                              + f"; it has {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
                              " (`synclib run --list-runs`)")
    return [r for r in every if r.name in picked]


def pair_family(cfg: dict, pair: str) -> str:
    a, b = pair.split("-")
    fa, fb = cfg["models"][a]["family"], cfg["models"][b]["family"]
    return fa if fa == fb else "Cross"


# --------------------------------------------------------------------------- fingerprints
def fingerprint(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def log_event(log: Path | None, job: str, event: str, **info) -> None:
    """Append one line to the run's own log of what it did (``RESULTS/run-log.jsonl``)."""
    if log is None:
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "job": job, "event": event, **info})
    with open(log, "a") as f:
        f.write(line + "\n")


class JobFailed(RuntimeError):
    """A job raised: one line naming the job, the error and where the full traceback is (the run's log)."""


def _one_line(exc: BaseException) -> str:
    """An exception in one line: a :class:`~synclib.notebook.NotebookFailed`'s own, else type and first line."""
    if isinstance(exc, NotebookFailed):
        return str(exc)
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


@dataclass(frozen=True)
class Job:
    """A node of the run graph: ``func(*deps_results)`` makes ``output``.  ``inputs``, all it depends on (settings,
    upstream fingerprints, file hashes), hash to its fingerprint; the stamp keeps them so a dry run names changes."""

    key: str
    output: Path
    inputs: dict
    func: Callable[..., Any]
    deps: tuple[str, ...] = ()
    gpu: bool = False
    log: Path | None = None
    check_only: bool = False  # its step is not among the run's steps: it must be done already

    @property
    def fp(self) -> str:
        return fingerprint(self.inputs)

    @property
    def step(self) -> str:
        """``simulate``, ..., ``notebooks`` (the manifest and the claims too) or ``book``."""
        kind = self.key.split(":")[0]
        return {"manifest": "notebooks", "claims": "notebooks", "notebook": "notebooks"}.get(kind, kind)

    def done(self) -> bool:
        return up_to_date(self.output, self.fp)

    def __call__(self, *dep_outputs):
        if self.done():
            print(f"[synclib] {self.key}: up to date ({self.output.name})", flush=True)
            log_event(self.log, self.key, "skipped")
            return str(self.output)
        if self.check_only:
            raise JobFailed(f"{self.key} is not done and its step is not among this run's steps")
        if self.key.split(":")[0] in _HEAVY:
            # one process makes an output at a time: a second worker, array task or command waits, then finds it done
            with output_lock(self.output, say=lambda line: print(line, flush=True)):
                if self.done():
                    print(f"[synclib] {self.key}: finished by another process ({self.output.name})", flush=True)
                    log_event(self.log, self.key, "skipped")
                    return str(self.output)
                return self._run(dep_outputs)
        return self._run(dep_outputs)

    def _run(self, dep_outputs):
        t0 = time.perf_counter()
        step = _CLOCK.start(self.key) if _CLOCK is not None else ""
        print(f"[synclib] {step}{self.key}: running -> {display(self.output)}", flush=True)
        log_event(self.log, self.key, "started")
        self.output.parent.mkdir(parents=True, exist_ok=True)
        _reset_gpu_peak()
        heavy = self.key.split(":")[0] in _HEAVY
        isolate = heavy and _ISOLATE
        if not isolate:  # in this process: what the previous job left (cycles, free heap pages) goes first
            gc.collect()
            release_free_memory()
        try:
            with PeakRSS(tree=isolate) as rss:
                # a dict of facts for the stamp (e.g. engine counters), or None
                extra = run_in_child(self.func, dep_outputs) if isolate else self.func(*dep_outputs)
        except Exception as exc:
            self._fail(exc, time.perf_counter() - t0)
        dt = time.perf_counter() - t0
        info = {"seconds": round(dt, 1), **(extra if isinstance(extra, dict) else {})}
        if rss.bytes is not None and heavy:
            info["peak_rss_gib"] = round(rss.bytes / 2**30, 2)
        peak = _gpu_peak_gib()
        if peak is not None:
            info["peak_gpu_gib"] = peak
        mark_done(self.output, self.fp, inputs=self.inputs, **info)
        log_event(self.log, self.key, "finished", **info)
        left = _CLOCK.finish(self.key, dt) if _CLOCK is not None else ""
        print(f"[synclib] {self.key}: done in {dt:.0f} s"
              + (f", peak memory {info['peak_rss_gib']} GiB" if "peak_rss_gib" in info else "")
              + (f", peak GPU memory {peak} GiB" if peak is not None else "") + left, flush=True)
        return str(self.output)

    def _fail(self, exc: Exception, seconds: float):
        """Log ``exc`` with its full traceback and raise it again as one line (:class:`JobFailed`)."""
        line = _one_line(exc)
        log_event(self.log, self.key, "failed", seconds=round(seconds, 1), error=line,
                  traceback=getattr(exc, "details", "") or traceback.format_exc())
        where = f"; the full traceback is in {display(self.log)}" if self.log is not None else ""
        raise JobFailed(f"{self.key} failed after {seconds:.0f} s: {line}{where}") from exc


#: the jobs that load models or whole cubes: a local run runs each in a child of its own (:func:`run_in_child`), so
#: its peak memory is its largest job's, not their sum; their stamps record this process's and the child's together
_HEAVY = ("simulate", "judge", "analyze")
#: whether heavy jobs run in a child process (set by :func:`execute` for local runs; Dask workers have their own)
_ISOLATE = False


class _RunClock:
    """Which step of how many a run is at and about how long is left: the dry run's estimates of the jobs
    still to run (:mod:`synclib.run.plan`), scaled by how the finished jobs' times compared with theirs."""

    def __init__(self, rows):
        self.order = [r.key for r in rows if r.status == "will run"]
        self.estimate = {r.key: r.seconds for r in rows if r.status == "will run"}
        self.done: dict[str, float] = {}
        self.started = 0

    def start(self, key: str) -> str:
        if key not in self.estimate:
            return ""
        self.started += 1  # notebooks run a few at a time: each start gets its own number
        return f"step {self.started} of {len(self.order)}: "

    def finish(self, key: str, seconds: float) -> str:
        if key not in self.estimate:
            return ""
        self.done[key] = seconds
        todo = [k for k in self.order if k not in self.done]
        if not todo or any(self.estimate[k] is None for k in todo):
            return ""
        known = [k for k in self.done if self.estimate[k]]
        scale = (sum(self.done[k] for k in known) / sum(self.estimate[k] for k in known)) if known else 1.0
        scale = min(max(scale, 0.5), 2.0)  # a resumed or cached job says little about the rest
        left = scale * wall_seconds((k, self.estimate[k]) for k in todo)
        return f"; {len(todo)} step(s) left, about {duration_text(left)}"


#: the running job graph's clock (set by :func:`clocked` for in-process runs)
_CLOCK: _RunClock | None = None


@contextmanager
def clocked(rows):
    """While the block runs, each in-process job says which step of how many it is and, when done, about how
    long the rest will take; ``rows`` is the run's plan (:func:`synclib.run.plan.plan`)."""
    global _CLOCK
    _CLOCK = _RunClock(rows)
    try:
        yield _CLOCK
    finally:
        _CLOCK = None


def _cuda():
    """``torch.cuda`` when torch is already imported and CUDA initialised, else None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def _reset_gpu_peak() -> None:
    if (cuda := _cuda()) is not None:
        cuda.reset_peak_memory_stats()


def _gpu_peak_gib() -> float | None:
    """Peak GPU memory allocated by this process since the last reset (GiB), if CUDA ran."""
    cuda = _cuda()
    return None if cuda is None else round(cuda.max_memory_allocated() / 2**30, 2)


# --------------------------------------------------------------------------- steps
def _device(cfg: dict) -> str | None:
    return None if cfg["device"] in (None, "auto") else cfg["device"]


def _dtype(cfg: dict) -> str | None:
    return cfg["dtype"]  # "auto": synclib.models.default_dtype on the machine that simulates


def _taskset(cfg: dict):
    return load_tasks(cfg["scenarios"])


def set_aside(path: Path, log: Path | None, job: str, why: str) -> Path:
    """Rename ``path`` (a stale cube, or an unfinished one's parts folder) to ``NAME.stale-YYYYmmdd-HHMMSS``
    with its stamp, and log it: a run never deletes what a GPU made.  Returns the new path."""
    ext = next((e for e in (".nc.parts", path.suffix) if path.name.endswith(e)), "")  # L3.2-M1.nc: a dot in the run
    new = path.with_name(f"{path.name[:len(path.name) - len(ext)]}.stale-{time.strftime('%Y%m%d-%H%M%S')}{ext}")
    os.replace(path, new)
    stamp = stamp_path(path)
    if stamp.exists():
        os.replace(stamp, stamp_path(new))
    print(f"[synclib] {job}: {why}: set aside as {display(new)} (delete it yourself once you no longer need it)",
          flush=True)
    log_event(log, job, "set aside", path=display(path), to=display(new), why=why)
    return new


def step_simulate(cfg: dict, run: Run, out: Path) -> dict:
    """Simulate one ordered run; returns the engine counters for the stamp.  A finished cube whose settings changed,
    and parts made with other settings, are set aside (:func:`set_aside`); parts of the same settings resume."""
    log = run_log(cfg)
    job = f"simulate:{run.name}"
    if read_stamp(out) is not None:
        set_aside(out, log, job, "its settings changed since the cube was made")
    parts = sorted(parts_dir(out).glob("part-*.nc"))
    if parts:
        log_event(log, job, "resuming", parts=len(parts))
        print(f"[synclib] {job}: resuming from {len(parts)} part(s) on disk", flush=True)
    try:
        return _simulate(cfg, run, out)
    except StalePartsError as exc:
        set_aside(exc.parts, log, job, "its parts on disk were made with other settings")
        return _simulate(cfg, run, out)


def _simulate(cfg: dict, run: Run, out: Path) -> dict:
    models, call = simulate_call(cfg, run)
    stats = call["options"].engine_stats
    simulate(*models, out=out, **call)
    return {"engine": stats}


def simulate_call(cfg: dict, run: Run, **options) -> tuple[tuple[str, str], dict]:
    """The config's one mapping to :func:`synclib.simulate.simulate` for an ordered run (the simulation job's and
    ``synclib bench``'s): the model specs and keyword arguments; ``options`` override ``RunOptions`` fields."""
    sim = cfg["simulate"]
    models = cfg["models"]
    taskset = _taskset(cfg)
    opts = dict(device=_device(cfg), dtype=_dtype(cfg), engine_stats={},
                prompt_formats=(models[run.a]["prompt_format"], models[run.b]["prompt_format"]))
    return (models[run.a]["spec"], models[run.b]["spec"]), dict(
        tasks=select_tasks(taskset, sim["episodes"]), seeds=sim["seeds"], max_utterances=sim["max_utterances"],
        sampling=Sampling.from_config(cfg), passes=Passes.from_config(cfg, taskset=taskset),
        batching=Batching.from_config(cfg), options=RunOptions.from_config(cfg, **{**opts, **options}))


def step_judge(cfg: dict, run: Run, out: Path, cube: str) -> None:
    # lazy: xarray and netCDF4 load only when the judge step runs (the dry run stays light)
    from synclib.judge import JudgeOptions, evaluate_cube

    evaluate_cube(cube, JudgeOptions.from_config(cfg), out=out)


def step_analyze(cfg: dict, run: Run, out: Path, cube: str) -> None:
    # lazy: torch loads only when the analysis step runs (the dry run stays light)
    from synclib.analysis import AnalysisSettings, analyze

    result = analyze(open_cube(cube), AnalysisSettings.from_config(cfg))  # the config's one mapping
    tmp = out.with_name(out.name + ".tmp")
    result.to_netcdf(tmp)
    os.replace(tmp, out)


def step_manifest(cfg: dict, out: Path, *dep_outputs: str) -> None:
    pairs = []
    for run in runs(cfg):
        m = cfg["models"]
        pairs.append({
            "name": run.name, "pair": run.pair, "order": run.order,
            "model_a": m[run.a]["label"], "model_b": m[run.b]["label"],
            "spec_a": m[run.a]["spec"], "spec_b": m[run.b]["spec"],
            "family": pair_family(cfg, run.pair),
            "cube": f"cubes/{run.name}.nc", "analysis": f"analysis/{run.name}.nc",
            "judge": f"judge/{run.name}.judge.csv",
        })

    embedded = all(str(m["spec"]) in EMBEDDED for m in cfg["models"].values())
    public_cfg = {k: v for k, v in cfg.items() if k != "cluster"}
    manifest = {"name": cfg["name"], "pairs": pairs, "config": public_cfg, "embedded": embedded,
                "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, default=str))
    os.replace(tmp, out)


def paper_price_markdown() -> str:
    """``config/paper.yaml``'s whole grid priced as its dry run prints it (from ``bench/results``, logins
    left out), in a text block: the reproduce page quotes what the code computes."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # a results folder that holds nothing: the whole grid
        cfg = config.load_config(PAPER_CONFIG, [f"results_dir={tmp}/paper"])
        every = [r.name for r in runs(cfg)]  # the runs' jobs, no notebooks or book
        rows = plan(build_jobs(cfg, ("simulate", "judge", "analyze"), every), cfg)
        lines = [line for line in price_lines(cfg, rows) if not line.startswith("login:")]
    wrapped = []  # a page's column, not a terminal's: each line wrapped, its continuation indented
    for line in lines:
        lead = " " * (len(line) - len(line.lstrip()))
        wrapped += textwrap.wrap(line, PAGE_TEXT_WIDTH, subsequent_indent=lead + "    ", break_on_hyphens=False)
    return "```text\n" + "\n".join(wrapped) + "\n```\n"


#: characters a generated text block of the book holds on a line
PAGE_TEXT_WIDTH = 76


def step_claims(cfg: dict, out: Path, manifest: str) -> None:
    """Judge every claim of the paper on the run (:mod:`synclib.analysis.claims`): ``RESULTS/claims.json``."""
    # lazy: xarray and the tests load only when the claims step runs (the dry run stays light)
    from synclib.analysis import claims, results

    nb = cfg["notebooks"]
    claims.write(results.load_results(Path(manifest).parent), results.load_published(),
                 ability_scores=nb["ability_scores"], ratings=nb["human_ratings"], judge_scores=nb["human_judge_scores"])


#: config keys ``notebooks.KEY`` naming files the claims step reads (table 1's abilities, table 4's ratings)
NOTEBOOK_FILES = ("ability_scores", "human_ratings", "human_judge_scores")


def failed_notebook(results_dir: str | Path, stem: str) -> Path:
    """Where a run keeps a failed notebook's executed copy, until the next run starts (:func:`clear_failed`)."""
    return Path(results_dir) / "failed" / f"{stem}.ipynb"


def clear_failed(results_dir: str | Path) -> None:
    """Forget the notebooks an earlier run kept as failed (``synclib run`` does it as it starts)."""
    import shutil

    shutil.rmtree(failed_notebook(results_dir, "x").parent, ignore_errors=True)


def step_notebook(cfg: dict, nb: Path, out: Path, claims: str) -> None:
    from papermill.exceptions import PapermillExecutionError

    # lazy: this module has its own execute() (a name clash at the top)
    from synclib.notebook import execute

    params = {"results_dir": display(Path(claims).parent)}
    tmp = out.with_name(out.stem + ".tmp.ipynb")
    kept = failed_notebook(Path(claims).parent, nb.stem)
    try:
        execute(nb, tmp, params)
    except PapermillExecutionError as exc:
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, kept)
        line, details = failure(exc, kept)
        raise NotebookFailed(line, details) from None
    kept.unlink(missing_ok=True)
    os.replace(tmp, out)


def step_book(cfg: dict, out: Path, *inputs: str) -> None:
    # jupyter-book's entry point run by this interpreter: works where its console script is not on PATH
    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", str(REPO_ROOT)]
    subprocess.run(cmd, check=True, cwd=REPO_ROOT)


# --------------------------------------------------------------------------- graph
def uses_gpu(cfg: dict) -> bool:
    """Whether the run's models may use a GPU (``device`` cuda or auto); its simulations (and a local judge)
    then hold one GPU each on a cluster (worker resource ``GPU=1``)."""
    return not str(cfg["device"]).startswith("cpu")


def run_log(cfg: dict) -> Path:
    """The run's own log of what it did (:func:`log_event`)."""
    return Path(cfg["results_dir"]) / "run-log.jsonl"


def _settings(cfg: dict, step: str) -> dict:
    """The values of the config keys that feed ``step`` (:mod:`synclib.config`); resolved paths inside the
    repository kept relative to it, so a moved checkout keeps its stamps."""
    out = {}
    for path in keys_of_step(step):
        head, _, sub = path.partition(".")
        value = cfg[head][sub] if sub else cfg[head]
        out[path] = display(value) if isinstance(value, str) and Path(value).is_absolute() else value
    if step == "judge" and out.get("judge.url") is not None:
        # the endpoint's node changes with each serving job; the model, the mode and the layout are what count
        out["judge.url"] = "served"
    if step == "simulate":
        # a cube depends only on its own two models (fingerprinted per run): a run made alone is the grid's run
        for key in ("models", "pairs", "orders"):
            out.pop(key, None)
    return out


def _file_hash(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        if p and Path(p).is_file():
            h.update(Path(p).read_bytes())
    return h.hexdigest()[:16]


def build_jobs(cfg: dict, steps=STEPS, only=None, pages=None) -> dict[str, Job]:
    """The run graph as ``{key: Job}``; ``Job.deps`` name other keys.  A job's ``inputs`` hold exactly what its
    output depends on: its step's config keys (:func:`synclib.config.keys_of_step`), its upstream jobs'
    fingerprints and the hashes of the files it reads (scenarios, notebooks, the library's code, the book's pages).
    ``steps`` are the steps that run; a job of another step stays only where a running job needs it, marked
    ``check_only``: it must be done already (:func:`not_done`) and never runs.  ``only`` names ordered runs
    (:func:`select_runs`): their simulate, judge and analyze jobs, without manifest, notebooks or book."""
    from functools import partial

    R = Path(cfg["results_dir"])
    log = run_log(cfg)
    jobs: dict[str, Job] = {}

    def add(key, output, inputs, func, deps=(), gpu=False):
        job = Job(key, output, inputs, func, tuple(deps), gpu, log)
        jobs[key] = job = dataclasses.replace(job, check_only=job.step not in steps)
        return job

    if cfg["scenarios"] == "embedded":
        scen = "embedded"
    elif cfg["scenarios"] in TASK_SETS:  # fetched files are checked against these hashes
        scen = f"{cfg['scenarios']}:{fingerprint(sorted(TASK_SETS[cfg['scenarios']].files.items()))}"
    else:
        scen = _file_hash(*(Path(cfg["scenarios"]) / f for f in ("envs.json", "agents.json", "env_agent_combos.json")))
    gpu = uses_gpu(cfg)
    final, upstream = [], []
    for run in (runs(cfg) if only is None else select_runs(cfg, only)):
        ma, mb = cfg["models"][run.a], cfg["models"][run.b]
        models = {"model_a": ma["spec"], "model_b": mb["spec"],
                  "prompt_format_a": ma["prompt_format"], "prompt_format_b": mb["prompt_format"]}
        sim = add(f"simulate:{run.name}", R / "cubes" / f"{run.name}.nc",
                  {**models, "scenario_files": scen, **_settings(cfg, "simulate"), "synclib": __version__},
                  partial(step_simulate, cfg, run, R / "cubes" / f"{run.name}.nc"), gpu=gpu)
        judge_out, analysis_out = R / "judge" / f"{run.name}.judge.csv", R / "analysis" / f"{run.name}.nc"
        judge = add(f"judge:{run.name}", judge_out, {"cube": sim.fp, **_settings(cfg, "judge")},
                    partial(step_judge, cfg, run, judge_out), (sim.key,), gpu and cfg["judge"]["url"] is None)
        analysis = add(f"analyze:{run.name}", analysis_out,
                       {"cube": sim.fp, **_settings(cfg, "analyze"), "analysis_format": ANALYSIS_FORMAT},
                       partial(step_analyze, cfg, run, analysis_out), (sim.key,),
                       str(cfg["device"]).startswith("cuda"))  # ridge grids on the GPU
        # the manifest depends on both, done now or before: `--steps notebooks,book` and a whole run agree
        upstream += [judge.fp, analysis.fp]
        final += [judge.key, analysis.key]
    if only is None:
        _book_jobs(cfg, add, final, upstream, pages)
    return _needed(jobs)


def code_hash(modules) -> str:
    """Hash of the package files ``modules`` import, directly or not: a job running them re-runs when one changes."""
    return _file_hash(*sorted(synclib_closure(modules)))


def synclib_closure(modules) -> set[Path]:
    """The files of the package's ``modules`` (dotted names) and of every module of the package they import,
    at load time or inside a function, with the packages' ``__init__`` on the way."""
    root = REPO_ROOT / "synclib"
    todo, seen = list(modules), set()
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # a module's packages run their __init__ first
            base = root.parent.joinpath(*parts[:i])
            path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            if path.is_file() and path not in seen:
                seen.add(path)
                todo += synclib_imports(path.read_text(), root.parent)
    return seen


def _book_jobs(cfg: dict, add, final: list, upstream: list, pages=None) -> None:
    """The manifest, the claims, the notebooks and the book (:func:`build_jobs`)."""
    from functools import partial


    R = Path(cfg["results_dir"])
    labels = {k: {"family": m["family"], "label": m["label"]} for k, m in cfg["models"].items()}
    manifest = add("manifest", R / "manifest.json",
                   {"upstream": upstream, "models": labels, "runs": [r.name for r in runs(cfg)],
                    **_settings(cfg, "notebooks")},
                   partial(step_manifest, cfg, R / "manifest.json"), final)
    # what pages and claims may read besides the run: the paper's numbers, the benchmarks, the paper's config
    data = _file_hash(PUBLISHED_NUMBERS, PAPER_CONFIG, *sorted(BENCH_RESULTS.glob("*.json")))
    claims = add("claims", R / CLAIMS_FILE,
                 {"manifest": manifest.fp, "code": code_hash(["synclib.analysis.claims"]),
                  "data": data, **{f"{key}_file": _file_hash(Path(cfg["notebooks"][key] or "")) for key in NOTEBOOK_FILES}},
                 partial(step_claims, cfg, R / CLAIMS_FILE), [manifest.key])
    nb_keys, nb_fps = [], []
    for nb in pages or figure_notebooks():
        out = EXECUTED_DIR / f"{nb.stem}.ipynb"
        job = add(f"notebook:{nb.stem}", out,
                  {"claims": claims.fp, "notebook": _file_hash(nb),
                   "code": code_hash(["synclib.notebook", *synclib_imports(nb.read_text(), REPO_ROOT)]),
                   "data": data},
                  partial(step_notebook, cfg, nb, out), [claims.key])
        nb_keys.append(job.key)
        nb_fps.append(job.fp)
    own = [p for p in sorted((REPO_ROOT / "book").rglob("*"))
           if p.is_file() and "executed" not in p.parts]
    own += [REPO_ROOT / "_config.yml", REPO_ROOT / "_toc.yml"]
    index = BUILD_DIR / "html" / "index.html"
    add("book", index, {"notebooks": nb_fps, "book_sources": _file_hash(*own),
                        **({"pages": [nb.stem for nb in pages]} if pages else {})},
        partial(step_book, cfg, index), nb_keys)


def _needed(jobs: dict[str, Job]) -> dict[str, Job]:
    """The jobs that run and the ``check_only`` jobs they need, directly or not, in the graph's order."""
    needed: set[str] = set()
    for key in reversed(list(jobs)):  # insertion order is a topological order
        if not jobs[key].check_only or key in needed:
            needed.add(key)
            needed.update(jobs[key].deps)
    return {k: j for k, j in jobs.items() if k in needed}


def not_done(jobs: dict[str, Job]) -> list[Job]:
    """The ``check_only`` jobs that are not done: the run cannot start before they are (``synclib run`` refuses)."""
    return [j for j in jobs.values() if j.check_only and not j.done()]


def execute(jobs: dict[str, Job], scheduler: str | None = None, cluster: ClusterSpec | None = None,
            retries: int = 2, isolate: bool = True) -> dict[str, str]:
    """Run the job graph with Dask and return ``{key: output path}``.  ``scheduler``: ``None`` runs one job at a
    time here, but the notebooks :data:`synclib.notebook.AT_ONCE` at a time (each in its own kernel); ``"sync"``
    every job one at a time; ``"threads"`` a local thread pool; any other string is a running ``dask.distributed``
    scheduler's address.  ``cluster`` (a :class:`~synclib.cluster.ClusterSpec`) starts an adaptive dask-jobqueue
    cluster instead.  ``isolate``: a local run gives each simulate, judge and analyze job its own child process
    (:func:`run_in_child`); False runs them here (for debuggers and profilers)."""
    import dask

    distributed = scheduler not in (None, "sync", "threads") or cluster is not None
    keys = list(jobs)
    if not distributed:
        global _ISOLATE
        before, _ISOLATE = _ISOLATE, isolate
        try:
            if scheduler is not None:
                nodes = to_delayed(jobs)
                values = dask.compute(*[nodes[k] for k in keys], scheduler=scheduler, optimize_graph=False)
                return dict(zip(keys, values))
            # one job at a time, then the notebooks (and what needs them) AT_ONCE at a time in threads, each on its
            # own kernel: after the heavy jobs, so that an interrupt never waits on a simulation in a thread
            later = _needing(jobs, {k for k in keys if k.startswith("notebook:")})
            first = [k for k in keys if k not in later]
            nodes = to_delayed({k: jobs[k] for k in first})
            done = dict(zip(first, dask.compute(*[nodes[k] for k in first], scheduler="sync", optimize_graph=False)))
            nodes = to_delayed(jobs, done=done)
            rest = [k for k in keys if k in later]
            done.update(zip(rest, dask.compute(*[nodes[k] for k in rest], scheduler="threads",
                                               num_workers=AT_ONCE, optimize_graph=False)))
            return {k: done[k] for k in keys}
        finally:
            _ISOLATE = before
    nodes = to_delayed(jobs, distributed)
    targets = [nodes[k] for k in keys]
    from dask.distributed import Client

    with dask.config.set(CLUSTER_CONFIG):
        cl = cluster.make() if cluster is not None else None
        client = Client(cl if cl is not None else scheduler)
        try:
            # a job whose worker dies or leaves is rescheduled by dask; `retries` re-runs jobs that raised
            futures = client.compute(targets, optimize_graph=False, retries=retries)
            values = client.gather(futures)
        finally:
            client.close()
            if cl is not None:
                cl.close()
    return dict(zip(keys, values))


#: dask settings of a run's own scheduler (``cluster.type``): a leaving worker's job is replaced after 5 s, not 15
#: (the output lock makes the new copy wait), and given up after 20 lost workers, not 3 (simulations outlive several)
CLUSTER_CONFIG = {"distributed.deploy.lost-worker-timeout": "5s", "distributed.scheduler.allowed-failures": 20}


def _needing(jobs: dict[str, Job], keys: set[str]) -> set[str]:
    """``keys`` and every job that depends on one of them, directly or not."""
    out = set(keys)
    for key, job in jobs.items():  # insertion order is a topological order
        if any(d in out for d in job.deps):
            out.add(key)
    return out


def to_delayed(jobs: dict[str, Job], distributed: bool = False, done: dict | None = None) -> dict[str, Any]:
    """One ``dask.delayed`` node per job, keyed like ``jobs``, wired by ``Job.deps``; jobs in ``done`` (key ->
    output) are not run again.  With ``distributed``, GPU jobs ask for the worker resource ``GPU=1``."""
    import dask
    from dask import delayed

    nodes: dict[str, Any] = dict(done or {})

    def node(key: str):
        if key not in nodes:
            job = jobs[key]
            deps = [node(d) for d in job.deps]
            annotations = {"resources": {"GPU": 1}} if (distributed and job.gpu) else {}
            with dask.annotate(**annotations):
                nodes[key] = delayed(job, pure=False)(*deps, dask_key_name=key)
        return nodes[key]

    for key in jobs:
        node(key)
    return nodes
