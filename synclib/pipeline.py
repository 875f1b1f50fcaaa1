"""The main job: one config -> simulate, judge, analyse, execute notebooks, build the book.

A run is a graph of jobs, one per (model pair, step), plus the notebooks and the book:

    simulate[pair] --> judge[pair]   --.
                  \--> analyze[pair] --+--> manifest --> notebook[i] --> book

The graph is executed by Dask.  Locally it runs in-process, one job after the
other (the default, ``scheduler: sync``).  With ``--scheduler ADDRESS`` or a
``cluster:`` section in the config the jobs go to a ``dask.distributed``
cluster; jobs that need a GPU ask for the worker resource ``GPU=1`` so that
two never share one (start GPU workers with ``--resources GPU=1``).

Every job is idempotent and skipped when its output exists and was made from
the same inputs (a fingerprint of the config section it depends on and of its
upstream outputs, stored beside the output as ``*.done.json``).  Simulation
resumes a cube that was interrupted, so a worker that dies mid-job loses
nothing already written: the job is retried and continues where it stopped.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "config" / "default.yaml"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
EXECUTED_DIR = REPO_ROOT / "book" / "executed"
GENERATED_DIR = REPO_ROOT / "book" / "_generated"
BENCH_RESULTS = REPO_ROOT / "bench" / "results"
STEPS = ("simulate", "judge", "analyze", "notebooks", "book")


class ConfigError(ValueError):
    """A run configuration is invalid; the message names the file and the key."""


# --------------------------------------------------------------------------- config
def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set simulate.episodes=12")
    key, value = item.split("=", 1)
    return key.strip().split("."), yaml.safe_load(value)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] = ()) -> dict:
    """Read a YAML run config, apply ``KEY=VALUE`` overrides and validate it.

    Relative paths in the config (``results_dir``, ``scenarios``,
    ``notebooks.ability_scores``) are resolved against the repository root when
    the file lives in the repository, else against the config file's folder.
    """
    path = Path(path or DEFAULT_CONFIG)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    for item in overrides:
        keys, value = _parse_override(item)
        node = cfg
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {k!r} is not a section")
        node[keys[-1]] = value
    base = REPO_ROOT if REPO_ROOT in path.resolve().parents else path.resolve().parent
    return validate_config(cfg, source=str(path), base=base)


def _require(cfg: dict, key: str, types, source: str, section: str = ""):
    where = f"{section}.{key}" if section else key
    if key not in cfg:
        raise ConfigError(f"{source}: missing key {where!r}")
    if not isinstance(cfg[key], types):
        names = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise ConfigError(f"{source}: {where!r} must be {names}, got {cfg[key]!r}")
    return cfg[key]


def validate_config(cfg: dict, source: str = "<config>", base: Path = REPO_ROOT) -> dict:
    """Check types and cross-references; fill defaults; resolve paths. Returns a new dict."""
    cfg = copy.deepcopy(cfg)
    cfg.setdefault("name", "run")
    _require(cfg, "results_dir", str, source)
    _require(cfg, "scenarios", str, source)
    cfg.setdefault("device", "auto")
    cfg.setdefault("dtype", "auto")
    models = _require(cfg, "models", dict, source)
    for key, m in models.items():
        if isinstance(m, str):
            models[key] = m = {"spec": m}
        if not isinstance(m, dict) or "spec" not in m:
            raise ConfigError(f"{source}: models.{key} needs a 'spec' (model name, path or hub id)")
        m.setdefault("family", key)
        m.setdefault("label", m["spec"])
    pairs = _require(cfg, "pairs", list, source)
    if not pairs:
        raise ConfigError(f"{source}: 'pairs' is empty")
    for p in pairs:
        parts = str(p).split("-")
        if len(parts) != 2 or any(x not in models for x in parts):
            raise ConfigError(
                f"{source}: pairs entry {p!r} must be 'A-B' with A and B keys of 'models' "
                f"({', '.join(models)})")
    sim = cfg.setdefault("simulate", {})
    for key, default in dict(episodes=40, seeds=[0], max_utterances=16, max_new_tokens=300,
                             temperature=0.7, batch_size=16, passive=True, tom=True,
                             store_dtype="float32").items():
        sim.setdefault(key, default)
    if not (isinstance(sim["episodes"], int) and sim["episodes"] > 0
            or isinstance(sim["episodes"], list) and sim["episodes"]):
        raise ConfigError(f"{source}: simulate.episodes must be a positive int or a list of task indices")
    if not isinstance(sim["seeds"], list) or not all(isinstance(s, int) for s in sim["seeds"]):
        raise ConfigError(f"{source}: simulate.seeds must be a list of ints, got {sim['seeds']!r}")
    judge = cfg.setdefault("judge", {})
    judge.setdefault("model", None)
    judge.setdefault("url", None)
    judge.setdefault("api_key_env", "OPENAI_API_KEY")
    judge.setdefault("mode", "constrained" if judge.get("url") is None else "json")
    judge.setdefault("concurrency", 8)
    judge.setdefault("limit", None)
    if judge["limit"] is not None and not (isinstance(judge["limit"], int) and judge["limit"] > 0):
        raise ConfigError(f"{source}: judge.limit must be a positive int or null, got {judge['limit']!r}")
    if judge["model"] is None:
        raise ConfigError(f"{source}: judge.model is required (a local model spec or the served model name)")
    ana = cfg.setdefault("analysis", {})
    for key, default in dict(alpha=0.1, n_samples=6500, split_seeds=[0, 1, 2], lags=[1, 2],
                             persona_disjoint=True, relationship=True, sample_sizes=None,
                             nonlinear=True, tom=True, max_resident_gib=2).items():
        ana.setdefault(key, default)
    if not (ana["alpha"] == "cv" or isinstance(ana["alpha"], (int, float)) and ana["alpha"] > 0):
        raise ConfigError(f"{source}: analysis.alpha must be a positive number or 'cv', got {ana['alpha']!r}")
    if not (isinstance(ana["max_resident_gib"], (int, float)) and ana["max_resident_gib"] >= 0):
        raise ConfigError(f"{source}: analysis.max_resident_gib must be a number >= 0 (GiB), "
                          f"got {ana['max_resident_gib']!r}")
    nb = cfg.setdefault("notebooks", {}) or {}
    cfg["notebooks"] = nb
    nb.setdefault("ability_scores", None)
    cfg.setdefault("cluster", None)

    def resolve(p):
        return str((base / p).resolve()) if p is not None and not Path(p).is_absolute() else p

    cfg["results_dir"] = resolve(cfg["results_dir"])
    if cfg["scenarios"] != "embedded":
        cfg["scenarios"] = resolve(cfg["scenarios"])
    nb["ability_scores"] = resolve(nb["ability_scores"])
    return cfg


def pair_family(cfg: dict, pair: str) -> str:
    a, b = pair.split("-")
    fa, fb = cfg["models"][a]["family"], cfg["models"][b]["family"]
    return fa if fa == fb else "Cross"


# --------------------------------------------------------------------------- fingerprints
def fingerprint(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _stamp_path(output: Path) -> Path:
    return output.with_name(output.name + ".done.json")


def up_to_date(output: Path, fp: str) -> bool:
    stamp = _stamp_path(output)
    if not (output.exists() and stamp.exists()):
        return False
    try:
        return json.loads(stamp.read_text()).get("fingerprint") == fp
    except (OSError, json.JSONDecodeError):
        return False


def mark_done(output: Path, fp: str, **info) -> None:
    stamp = _stamp_path(output)
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps({"fingerprint": fp, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **info}, indent=1))
    os.replace(tmp, stamp)


@dataclass(frozen=True)
class Job:
    """One node of the run graph: ``func(*deps_results)`` produces ``output``."""

    key: str
    output: Path
    fp: str
    func: Callable[..., Any]
    deps: tuple[str, ...] = ()
    gpu: bool = False

    def __call__(self, *dep_outputs):
        if up_to_date(self.output, self.fp):
            print(f"[synclib] {self.key}: up to date ({self.output.name})", flush=True)
            return str(self.output)
        t0 = time.perf_counter()
        print(f"[synclib] {self.key}: running -> {self.output}", flush=True)
        self.output.parent.mkdir(parents=True, exist_ok=True)
        _reset_gpu_peak()
        self.func(*dep_outputs)
        dt = time.perf_counter() - t0
        info = {"seconds": round(dt, 1)}
        peak = _gpu_peak_gib()
        if peak is not None:
            info["peak_gpu_gib"] = peak
        mark_done(self.output, self.fp, **info)
        print(f"[synclib] {self.key}: done in {dt:.0f} s"
              + (f", peak GPU memory {peak} GiB" if peak is not None else ""), flush=True)
        return str(self.output)


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
    return None if cfg["dtype"] in (None, "auto") else cfg["dtype"]


def _tasks(cfg: dict):
    from synclib.scenarios import load_tasks

    taskset = load_tasks(cfg["scenarios"])
    episodes = cfg["simulate"]["episodes"]
    if isinstance(episodes, int):
        if episodes > len(taskset.tasks):
            print(f"[synclib] simulate.episodes={episodes} but {cfg['scenarios']} has "
                  f"{len(taskset.tasks)} tasks; using all of them", flush=True)
        return list(taskset.tasks[:episodes])
    by_index = {t.index: t for t in taskset.tasks}
    missing = [i for i in episodes if i not in by_index]
    if missing:
        raise ConfigError(f"simulate.episodes names task indices not in {cfg['scenarios']}: {missing}")
    return [by_index[i] for i in episodes]


def step_simulate(cfg: dict, pair: str, out: Path) -> None:
    from synclib.simulate import simulate

    a, b = pair.split("-")
    sim = cfg["simulate"]
    simulate(
        cfg["models"][a]["spec"], cfg["models"][b]["spec"], _tasks(cfg), sim["seeds"], out,
        max_utterances=sim["max_utterances"], temperature=sim["temperature"],
        max_new_tokens=sim["max_new_tokens"], passive=sim["passive"], tom=sim["tom"],
        batch_size=sim["batch_size"], device=_device(cfg), dtype=_dtype(cfg),
        store_dtype=sim["store_dtype"],
    )


def step_judge(cfg: dict, pair: str, out: Path, cube: str) -> None:
    from synclib.judge import evaluate_cube

    j = cfg["judge"]
    evaluate_cube(
        cube, scenarios=cfg["scenarios"], judge_model=j["model"], judge_url=j["url"],
        api_key_env=j["api_key_env"], mode=j["mode"], concurrency=j["concurrency"],
        out=out, device=_device(cfg), limit=j["limit"],
    )


def step_analyze(cfg: dict, pair: str, out: Path, cube: str) -> None:
    from synclib.analysis import analyze
    from synclib.cube import open_cube

    ana = cfg["analysis"]
    sim = cfg["simulate"]
    result = analyze(
        open_cube(cube), alpha=ana["alpha"], n_samples=ana["n_samples"],
        split_seeds=tuple(ana["split_seeds"]), lags=tuple(ana["lags"]), device=_device(cfg),
        persona_disjoint=ana["persona_disjoint"], relationship=ana["relationship"],
        sample_sizes=ana["sample_sizes"] or None, nonlinear=ana["nonlinear"],
        tom=ana["tom"] and sim["tom"], max_resident_bytes=int(ana["max_resident_gib"] * 2**30),
    )
    tmp = out.with_name(out.name + ".tmp")
    result.to_netcdf(tmp)
    os.replace(tmp, out)


def step_manifest(cfg: dict, out: Path, *dep_outputs: str) -> None:
    R = Path(cfg["results_dir"])
    pairs = []
    for pair in cfg["pairs"]:
        a, b = pair.split("-")
        pairs.append({
            "name": pair,
            "model_a": cfg["models"][a]["label"], "model_b": cfg["models"][b]["label"],
            "spec_a": cfg["models"][a]["spec"], "spec_b": cfg["models"][b]["spec"],
            "family": pair_family(cfg, pair),
            "cube": f"cubes/{pair}.nc", "analysis": f"analysis/{pair}.nc",
            "judge": f"judge/{pair}.judge.csv",
        })
    from synclib.models import EMBEDDED

    embedded = all(str(m["spec"]) in EMBEDDED for m in cfg["models"].values())
    public_cfg = {k: v for k, v in cfg.items() if k != "cluster"}
    manifest = {"name": cfg["name"], "pairs": pairs, "config": public_cfg, "embedded": embedded,
                "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, default=str))
    os.replace(tmp, out)
    write_run_summary(R)


def _write_generated(name: str, text: str) -> Path:
    out = GENERATED_DIR / name
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    return out


def write_run_summary(results_dir: Path) -> Path:
    """The intro's generated run summary (models, sizes, headline numbers)."""
    from synclib import report, results

    return _write_generated("run_summary.md", report.run_summary_markdown(results.load_results(results_dir)))


def write_benchmarks_page() -> Path:
    """The benchmarks page's generated part, quoted from ``bench/results``."""
    from synclib import report

    return _write_generated("benchmarks.md", report.benchmarks_markdown(BENCH_RESULTS))


def step_notebook(cfg: dict, nb: Path, out: Path, manifest: str) -> None:
    import papermill as pm

    params = {"results_dir": str(Path(manifest).parent)}
    if cfg["notebooks"].get("ability_scores"):
        params["ability_scores"] = cfg["notebooks"]["ability_scores"]
    declared = set(pm.inspect_notebook(str(nb)))
    params = {k: v for k, v in params.items() if k in declared}
    tmp = out.with_name(out.stem + ".tmp.ipynb")
    pm.execute_notebook(str(nb), str(tmp), parameters=params, cwd=str(nb.parent),
                        progress_bar=False, kernel_name="python3")
    _hide_injected_parameters(tmp)
    os.replace(tmp, out)


def _hide_injected_parameters(path: Path) -> None:
    """Papermill adds a cell with the injected parameters; the book need not show it."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            cell.metadata.setdefault("tags", []).append("remove-cell")
    nbformat.write(nb, str(path))


def step_book(cfg: dict, out: Path, *notebooks: str) -> None:
    write_benchmarks_page()
    # jupyter-book's own entry point, run by this interpreter: works where its
    # console script is not on PATH (e.g. packages installed with --target)
    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", str(REPO_ROOT)]
    subprocess.run(cmd, check=True, cwd=REPO_ROOT)


# --------------------------------------------------------------------------- graph
def _file_hash(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        if p and Path(p).is_file():
            h.update(Path(p).read_bytes())
    return h.hexdigest()[:16]


def notebooks() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def build_jobs(cfg: dict, steps=STEPS) -> dict[str, Job]:
    """The run graph as ``{key: Job}``; ``Job.deps`` name other keys."""
    from functools import partial

    from synclib import __version__

    R = Path(cfg["results_dir"])
    jobs: dict[str, Job] = {}
    local_judge = cfg["judge"]["url"] is None
    scen_fp = cfg["scenarios"] if cfg["scenarios"] == "embedded" else _file_hash(
        *(Path(cfg["scenarios"]) / f for f in ("envs.json", "agents.json", "env_agent_combos.json")))
    code_fp = _file_hash(*sorted((REPO_ROOT / "synclib").glob("*.py")))
    final_deps = []
    for pair in cfg["pairs"]:
        a, b = pair.split("-")
        specs = (cfg["models"][a]["spec"], cfg["models"][b]["spec"])
        cube = R / "cubes" / f"{pair}.nc"
        fp_sim = fingerprint("simulate", specs, scen_fp, cfg["simulate"], cfg["dtype"], __version__)
        jobs[f"simulate:{pair}"] = Job(f"simulate:{pair}", cube, fp_sim,
                                       partial(step_simulate, cfg, pair, cube), gpu=True)
        if "judge" in steps:
            csv = R / "judge" / f"{pair}.judge.csv"
            jobs[f"judge:{pair}"] = Job(f"judge:{pair}", csv, fingerprint("judge", fp_sim, cfg["judge"]),
                                        partial(step_judge, cfg, pair, csv), deps=(f"simulate:{pair}",),
                                        gpu=local_judge)
            final_deps.append(f"judge:{pair}")
        if "analyze" in steps:
            res = R / "analysis" / f"{pair}.nc"
            # the memory budget changes how the analysis reads, not what it finds
            fp_ana = {k: v for k, v in cfg["analysis"].items() if k != "max_resident_gib"}
            jobs[f"analyze:{pair}"] = Job(f"analyze:{pair}", res, fingerprint("analyze", fp_sim, fp_ana),
                                          partial(step_analyze, cfg, pair, res), deps=(f"simulate:{pair}",))
            final_deps.append(f"analyze:{pair}")
        if "judge" not in steps and "analyze" not in steps:
            final_deps.append(f"simulate:{pair}")
    if "notebooks" not in steps:
        return jobs
    manifest = R / "manifest.json"
    fp_manifest = fingerprint("manifest", [jobs[k].fp for k in final_deps], cfg["models"], cfg["pairs"])
    jobs["manifest"] = Job("manifest", manifest, fp_manifest, partial(step_manifest, cfg, manifest),
                           deps=tuple(final_deps))
    nb_keys = []
    for nb in notebooks():
        out = EXECUTED_DIR / nb.name
        fp = fingerprint("notebook", fp_manifest, _file_hash(nb), code_fp, cfg["notebooks"],
                         _file_hash(Path(cfg["notebooks"]["ability_scores"] or "")))
        key = f"notebook:{nb.stem}"
        jobs[key] = Job(key, out, fp, partial(step_notebook, cfg, nb, out), deps=("manifest",))
        nb_keys.append(key)
    if "book" in steps:
        # the book's own pages and the benchmark results its benchmarks page quotes; the
        # run summary and executed notebooks are covered by the notebooks' fingerprints
        pages = [p for p in sorted((REPO_ROOT / "book").rglob("*"))
                 if p.is_file() and not {"_generated", "executed"} & set(p.parts)]
        pages += [REPO_ROOT / "_config.yml", REPO_ROOT / "_toc.yml", *sorted(BENCH_RESULTS.glob("*.json"))]
        fp = fingerprint("book", [jobs[k].fp for k in nb_keys], _file_hash(*pages))
        index = REPO_ROOT / "_build" / "html" / "index.html"
        jobs["book"] = Job("book", index, fp, partial(step_book, cfg, index), deps=tuple(nb_keys))
    return jobs


def execute(jobs: dict[str, Job], scheduler: str | None = None, cluster: dict | None = None,
            retries: int = 2) -> dict[str, str]:
    """Run the job graph with Dask and return ``{key: output path}``.

    ``scheduler``: ``None``/``"sync"`` runs in-process one job at a time;
    ``"threads"`` uses a local thread pool; any other string is the address of
    a running ``dask.distributed`` scheduler.  ``cluster`` (from the config)
    creates a dask-jobqueue cluster instead, e.g. ``{type: slurm, jobs: 4,
    cores: 8, memory: 64GB, job_extra_directives: ["--gres=gpu:1"]}``.
    """
    import dask

    distributed = scheduler not in (None, "sync", "threads") or bool(cluster)
    nodes = to_delayed(jobs, distributed)
    keys = list(jobs)
    targets = [nodes[k] for k in keys]
    if not distributed:
        values = dask.compute(*targets, scheduler=scheduler or "sync", optimize_graph=False)
        return dict(zip(keys, values))
    from dask.distributed import Client

    cl = make_cluster(cluster) if cluster else None
    client = Client(cl if cl is not None else scheduler)
    try:
        # a job whose worker dies is rescheduled by dask; `retries` re-runs jobs that raised
        futures = client.compute(targets, optimize_graph=False, retries=retries)
        values = client.gather(futures)
    finally:
        client.close()
        if cl is not None:
            cl.close()
    return dict(zip(keys, values))


def to_delayed(jobs: dict[str, Job], distributed: bool = False) -> dict[str, Any]:
    """One ``dask.delayed`` node per job, keyed like ``jobs``, wired by ``Job.deps``.

    With ``distributed``, jobs that need a GPU are annotated with the worker
    resource ``GPU=1``.
    """
    import dask
    from dask import delayed

    nodes: dict[str, Any] = {}

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


def make_cluster(spec: dict):
    """Create a dask-jobqueue (or local) cluster from a config mapping."""
    spec = dict(spec)
    kind = spec.pop("type", "local").lower()
    n_jobs = int(spec.pop("jobs", 1))
    if kind == "local":
        from dask.distributed import LocalCluster

        return LocalCluster(n_workers=n_jobs, **spec)
    try:
        import dask_jobqueue
    except ImportError:  # pragma: no cover - optional extra
        raise ConfigError("cluster.type needs dask-jobqueue: pip install 'synclib[cluster]'") from None
    classes = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "sge": "SGECluster", "lsf": "LSFCluster"}
    if kind not in classes:
        raise ConfigError(f"cluster.type must be one of local, {', '.join(classes)}; got {kind!r}")
    cl = getattr(dask_jobqueue, classes[kind])(**spec)
    cl.scale(jobs=n_jobs)
    return cl


# --------------------------------------------------------------------------- CLI
def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=str(DEFAULT_CONFIG),
                   help="YAML run config (default: config/default.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set simulate.episodes=12 (repeatable)")
    p.add_argument("--steps", default=",".join(STEPS),
                   help=f"comma-separated steps to run, in order: {','.join(STEPS)} (default: all)")
    p.add_argument("--scheduler", default=None,
                   help="'sync' (default, in-process), 'threads', or a dask.distributed scheduler "
                        "address such as tcp://10.0.0.1:8786")
    p.add_argument("--force", action="store_true", help="re-run every job even if up to date (a finished cube is still re-used: "
                        "delete it to simulate again)")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, args.overrides)
        steps = tuple(s.strip() for s in args.steps.split(",") if s.strip())
        bad = [s for s in steps if s not in STEPS]
        if bad:
            raise ConfigError(f"--steps: unknown step(s) {bad}; choose from {', '.join(STEPS)}")
    except ConfigError as exc:
        print(f"synclib run: {exc}", file=sys.stderr)
        return 2
    jobs = build_jobs(cfg, steps)
    if args.force:
        for job in jobs.values():
            _stamp_path(job.output).unlink(missing_ok=True)
    cluster = cfg.get("cluster") or {}
    scheduler = args.scheduler or cluster.get("scheduler")
    cluster_spec = {k: v for k, v in cluster.items() if k != "scheduler"} or None
    t0 = time.perf_counter()
    print(f"[synclib] run {cfg['name']!r}: {len(jobs)} jobs, results in {cfg['results_dir']}", flush=True)
    execute(jobs, scheduler=scheduler, cluster=cluster_spec if not args.scheduler else None)
    print(f"[synclib] finished in {time.perf_counter() - t0:.0f} s", flush=True)
    if "book" in jobs:
        print(f"[synclib] the book: {jobs['book'].output}", flush=True)
    return 0
