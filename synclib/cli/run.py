"""``synclib run``: the main job (:mod:`synclib.run.pipeline`) from a run config and ``--set`` overrides.

The config, its hub ids and a task set not cached yet are checked or fetched before any job starts;
``--dry-run`` prints the plan (:mod:`synclib.run.plan`) and the training samples per dataset instead.
"""
from __future__ import annotations

import argparse
import sys
import time

from synclib.analysis.sizing import format_sizes, run_sizes
from synclib.config import STEPS, ConfigError, load_config
from synclib.notebook import choose
from synclib.paths import DEFAULT_CONFIG, display
from synclib.cluster import is_scheduler_address, spec_of
from synclib.run.pipeline import (JobFailed, build_jobs, clear_failed, clocked, execute, not_done, runs,
                                    select_runs)
from synclib.run.hub import HubReport, check_models, is_hub_id
from synclib.run.plan import CALIBRATION, format_plan, machine_ratios, plan, plan_summary
from synclib.run.price import check_scheduler, load_bench
from synclib.stamps import stamp_path
from synclib.tasks.datasets import TASK_SETS, DatasetError, how_to_fetch, is_cached
from synclib.tasks.datasets import fetch as fetch_dataset

__all__ = ["configure_parser", "run"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``synclib run``."""
    p.add_argument("--config", default=str(DEFAULT_CONFIG),
                   help="YAML run config (default: config/default.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set simulate.episodes=12 (repeatable)")
    p.add_argument("--steps", default=",".join(STEPS),
                   help=f"comma-separated steps to run, in order: {','.join(STEPS)} (default: all)")
    p.add_argument("--scheduler", default=None,
                   help="'sync' (one job at a time; by default the notebooks run a few at a time, each in its "
                        "own kernel), 'threads', or a dask.distributed scheduler address such as tcp://10.0.0.1:8786")
    p.add_argument("--force", action="store_true", help="re-run every job even if up to date (a finished cube is still re-used: "
                        "delete it to simulate again)")
    p.add_argument("--in-process", action="store_true",
                   help="run the simulation, judge and analysis jobs in this process (for debuggers and "
                        "profilers); by default each runs in a child process of its own, so that what one job "
                        "leaves in memory is not resident under the next")
    p.add_argument("--dry-run", action="store_true",
                   help="validate the config and print the plan (every job, whether it is up to date and, if "
                        "not, why; disk and time estimates), running nothing")
    p.add_argument("--runs", default=None, metavar="RUN[,RUN...]",
                   help="run only these ordered runs (names like M1-L2, or positions 0, 1, ... as --list-runs "
                        "numbers them: an array job's task id): their simulation, judge and analysis; the notebooks "
                        "and the book wait for every run (--steps notebooks,book once all are in)")
    p.add_argument("--pages", default=None, metavar="NAME[,NAME...]",
                   help="re-run only these notebooks (by name, e.g. fig02_heatmaps, or a unique prefix, fig02) and "
                        "rebuild the book with the other pages as they were last executed (make page NAME=...)")
    p.add_argument("--list-runs", action="store_true",
                   help="print the config's ordered runs, one per line with its position, and exit")
    p.add_argument("--no-timing", action="store_true",
                   help="on a CPU, price the jobs at the calibration machine's speed instead of timing a few "
                        "forwards of each model (and one ridge grid) on this one first (seconds, once per machine "
                        "and dtype: synclib.run.speed)")


def _ratios(args, cfg: dict, jobs: dict, log=print) -> dict | None:
    """This machine's speed over the calibration's (:func:`synclib.run.plan.machine_ratios`) where a simulate, judge
    or analyze job will run on the CPU and ``--no-timing`` is not given; else None."""
    heavy = [j for k, j in jobs.items() if k.split(":")[0] in ("simulate", "judge", "analyze") and not j.check_only]
    if args.no_timing or all(j.done() for j in heavy):
        return None
    return machine_ratios(cfg, load_bench(CALIBRATION), log=log)


def _dataset_sizes(cfg: dict, steps) -> str:
    """Each ordered run's training samples per dataset, warning where SyncR² would stay at 0; "" without analyze."""
    if "analyze" not in steps:
        return ""
    return format_sizes(run_sizes(cfg, runs(cfg)))


def _scheduler_ok(text: str) -> bool:
    return text in ("sync", "threads") or is_scheduler_address(text)


#: seconds a dry run waits for a scheduler to answer
SCHEDULER_TIMEOUT = 5.0


def _probe_scheduler(args: argparse.Namespace, cfg: dict) -> dict | None:
    """:func:`synclib.run.price.check_scheduler` of ``--scheduler`` or ``cluster.scheduler``, with its
    ``address``; None for ``sync``/``threads`` or none named."""
    address = args.scheduler or (cfg.get("cluster") or {}).get("scheduler")
    if not address or address in ("sync", "threads"):
        return None
    return {"address": address, **check_scheduler(address, SCHEDULER_TIMEOUT)}


def _missing_text(missing, args) -> str:
    """Why the run cannot start: the jobs of steps it does not run that are not done."""
    names = ", ".join(j.key for j in missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
    steps = sorted({j.step for j in missing}, key=STEPS.index)
    return (f"synclib run: {len(missing)} job(s) of step(s) not in --steps {args.steps} are not done: {names}. "
            f"Run them first (--steps {','.join(steps)}, or a whole run; on a cluster, every ordered run with "
            "--runs) and run this command again; nothing was started")


#: seconds the hub may take to answer one model id
HUB_TIMEOUT = 5.0


def _check_hub(cfg: dict, only) -> HubReport | None:
    """The hub check of the models the run loads (its ordered runs', a local judge's); None without hub ids."""
    chosen = runs(cfg) if only is None else select_runs(cfg, only)
    specs = [cfg["models"][k]["spec"] for r in chosen for k in (r.a, r.b)]
    if cfg["judge"]["url"] is None:
        specs.append(cfg["judge"]["model"])
    if not any(is_hub_id(s) for s in specs):
        return None
    return check_models(specs, timeout=HUB_TIMEOUT)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``synclib run``: 0 when done, 1 when a job failed (one line), 2 on a bad config or option."""
    try:
        cfg = load_config(args.config, args.overrides)
        steps = tuple(s.strip() for s in args.steps.split(",") if s.strip())
        bad = [s for s in steps if s not in STEPS]
        if bad:
            raise ConfigError(f"--steps: unknown step(s) {bad}; choose from {', '.join(STEPS)}")
        if not steps:
            raise ConfigError(f"--steps: no step given; choose from {', '.join(STEPS)}")
        if args.scheduler is not None and not _scheduler_ok(args.scheduler):
            raise ConfigError(f"--scheduler: {args.scheduler!r} is neither 'sync', 'threads' nor a scheduler "
                              "address like tcp://10.0.0.1:8786")
        if args.list_runs:
            for i, r in enumerate(runs(cfg)):
                print(f"{i} {r.name}")
            return 0
        only = None if args.runs is None else [x for x in args.runs.split(",") if x.strip()]
        if only is not None:
            select_runs(cfg, only)  # names checked before anything else
            if not only:
                raise ConfigError("--runs: no run given; `synclib run --list-runs` lists them")
            left = [s for s in steps if s in ("notebooks", "book")]
            steps = tuple(s for s in steps if s not in left)
            if left:
                print(f"[synclib] --runs: {' and '.join(left)} left out: they need every run's results "
                      "(`synclib run --steps notebooks,book` once all are in)", flush=True)
            if not steps:
                raise ConfigError("--runs with --steps notebooks,book runs nothing: the notebooks and the book are "
                                  "built from every run at once (drop --runs)")
        pages = None
        if args.pages is not None:
            try:
                pages = choose([x for x in args.pages.split(",") if x.strip()]) or None
            except ValueError as exc:
                raise ConfigError(f"--pages: {exc}") from None
            if pages is None or only is not None:
                raise ConfigError("--pages names notebooks to re-run (e.g. --pages fig02), without --runs")
    except ConfigError as exc:
        print(f"synclib run: {exc}", file=sys.stderr)
        return 2
    hub = _check_hub(cfg, only)
    if hub is not None and hub.error():
        print(f"synclib run: {hub.error().rstrip('.')}. Nothing was started.", file=sys.stderr)
        return 2
    ds = TASK_SETS.get(cfg["scenarios"])
    not_fetched = ""
    if ds is not None and not is_cached(ds):
        if args.dry_run:  # priced from the set's recorded size (count_tasks); the run fetches it first
            not_fetched = (f"tasks: scenarios {ds.name} is not fetched yet: the plan counts its {ds.n_tasks} tasks as "
                           f"recorded; `synclib run` fetches it first, or {how_to_fetch(ds)}")
        try:
            if not args.dry_run:
                fetch_dataset(ds)
                cfg = load_config(args.config, args.overrides)  # now the episodes can be checked
        except (DatasetError, ConfigError) as exc:
            print(f"synclib run: scenarios: {exc}", file=sys.stderr)
            return 2
    jobs = build_jobs(cfg, steps, only, pages)
    sizes = _dataset_sizes(cfg, steps)
    missing = not_done(jobs)
    if args.dry_run:
        print(f"run {cfg['name']!r}, results in {display(cfg['results_dir'])} (dry run: nothing is started)")
        if not_fetched:
            print(not_fetched)
        if hub is not None:
            print("\n".join(hub.lines()))
        ratios = _ratios(args, cfg, jobs)
        print(format_plan(plan(jobs, cfg, ratios), cfg, scheduler=_probe_scheduler(args, cfg),
                          config_path=display(args.config), n_runs=len(runs(cfg)), ratios=ratios))
        if sizes:
            print(sizes)
        if missing:
            print(_missing_text(missing, args), file=sys.stderr)
        return 2 if missing else 0
    if missing:
        print(_missing_text(missing, args), file=sys.stderr)
        return 2
    if args.force:
        for job in jobs.values():
            if not job.check_only:
                stamp_path(job.output).unlink(missing_ok=True)
    spec = spec_of(cfg)
    scheduler = args.scheduler or (spec.scheduler if spec else None)
    cluster = spec if spec is not None and spec.type and not args.scheduler else None
    t0 = time.perf_counter()
    clear_failed(cfg["results_dir"])
    rows = plan(jobs, cfg, _ratios(args, cfg, jobs, log=lambda m: print(f"[synclib] {m}", flush=True)))
    print(f"[synclib] run {cfg['name']!r}: {len(jobs)} jobs, results in {display(cfg['results_dir'])}", flush=True)
    if hub is not None and (hub.reachable is not True or hub.not_cached):
        print("\n".join("[synclib] " + line for line in hub.lines()), flush=True)
    print("[synclib] " + plan_summary(rows), flush=True)
    if sizes:
        print("\n".join("[synclib] " + line for line in sizes.splitlines()), flush=True)
    with clocked(rows):
        try:
            execute(jobs, scheduler=scheduler, cluster=cluster, isolate=not getattr(args, "in_process", False))
        except JobFailed as exc:  # one line; the traceback is in the run's log
            print(f"[synclib] FAILED: {exc}", file=sys.stderr, flush=True)
            print("[synclib] the jobs that finished are kept: fix the cause and run the same command again to "
                  "resume", file=sys.stderr, flush=True)
            return 1
    print(f"[synclib] finished in {time.perf_counter() - t0:.0f} s", flush=True)
    if "book" in jobs:
        print(f"[synclib] the book: {display(jobs['book'].output)}", flush=True)
    return 0
