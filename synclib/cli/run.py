"""``synclib run``: the main job (:mod:`synclib.run.pipeline`) from a run config and ``--set``
overrides: simulate, judge, analyse, execute notebooks, build the book.

The config is checked (:func:`synclib.config.load_config`) and a task set that is not
cached yet is fetched before any job starts; ``--dry-run`` prints the plan
(:mod:`synclib.run.plan`) and the training samples per dataset (:mod:`synclib.analysis.sizing`) instead.
"""
from __future__ import annotations

import argparse
import sys
import time

from synclib.analysis.sizing import format_sizes, run_sizes
from synclib.config import STEPS, ConfigError, load_config
from synclib.paths import DEFAULT_CONFIG, display
from synclib.run.pipeline import JobFailed, build_jobs, clear_failed, clocked, execute, runs
from synclib.run.plan import format_plan, plan, plan_summary
from synclib.run.price import check_scheduler
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


def _dataset_sizes(cfg: dict, steps) -> str:
    """The training samples per dataset of each ordered run, and a warning where the
    measured sample-size curves say SyncR² would stay at 0 (:mod:`synclib.analysis.sizing`);
    empty when the run analyses nothing."""
    if "analyze" not in steps:
        return ""
    return format_sizes(run_sizes(cfg, runs(cfg)))


def _scheduler_ok(text: str) -> bool:
    import re

    return text in ("sync", "threads") or bool(re.fullmatch(r"(tcp|tls|inproc|ucx)://\S+|[\w.-]+:\d+", text))


#: seconds a dry run waits for a scheduler to answer
SCHEDULER_TIMEOUT = 5.0


def _probe_scheduler(args: argparse.Namespace, cfg: dict) -> dict | None:
    """A dry run's look at the named dask scheduler (``--scheduler`` or ``cluster.scheduler``):
    whether it answers within :data:`SCHEDULER_TIMEOUT` s, its workers and GPU workers; None for
    ``sync``/``threads`` or none named."""
    address = args.scheduler or (cfg.get("cluster") or {}).get("scheduler")
    if not address or address in ("sync", "threads"):
        return None
    return {"address": address, **check_scheduler(address, SCHEDULER_TIMEOUT)}


def run(args: argparse.Namespace) -> int:
    """``synclib run``: check the config, fetch a task set not cached yet, then print the plan
    (``--dry-run``) or execute the job graph; 0 when done, 1 when a job failed (one line), 2 on a
    bad config or option."""
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
    except ConfigError as exc:
        print(f"synclib run: {exc}", file=sys.stderr)
        return 2
    ds = TASK_SETS.get(cfg["scenarios"])
    if ds is not None and not is_cached(ds):
        if args.dry_run:
            print(f"synclib run: scenarios: {ds.name}: not fetched yet; {how_to_fetch(ds)} "
                  "(`synclib run` without --dry-run fetches it first)", file=sys.stderr)
            return 2
        try:
            fetch_dataset(ds)
            cfg = load_config(args.config, args.overrides)  # now the episodes can be checked
        except (DatasetError, ConfigError) as exc:
            print(f"synclib run: scenarios: {exc}", file=sys.stderr)
            return 2
    jobs = build_jobs(cfg, steps)
    sizes = _dataset_sizes(cfg, steps)
    if args.dry_run:
        print(f"run {cfg['name']!r}, results in {display(cfg['results_dir'])} (dry run: nothing is started)")
        print(format_plan(plan(jobs, cfg), cfg, scheduler=_probe_scheduler(args, cfg)))
        if sizes:
            print(sizes)
        return 0
    if args.force:
        for job in jobs.values():
            stamp_path(job.output).unlink(missing_ok=True)
    cluster = cfg.get("cluster") or {}
    scheduler = args.scheduler or cluster.get("scheduler")
    cluster_spec = {k: v for k, v in cluster.items() if k != "scheduler"} or None
    t0 = time.perf_counter()
    clear_failed(cfg["results_dir"])
    rows = plan(jobs, cfg)
    print(f"[synclib] run {cfg['name']!r}: {len(jobs)} jobs, results in {display(cfg['results_dir'])}", flush=True)
    print("[synclib] " + plan_summary(rows), flush=True)
    if sizes:
        print("\n".join("[synclib] " + line for line in sizes.splitlines()), flush=True)
    with clocked(rows):
        try:
            execute(jobs, scheduler=scheduler, cluster=cluster_spec if not args.scheduler else None,
                    isolate=not getattr(args, "in_process", False))
        except JobFailed as exc:  # one line; the traceback is in the run's log
            print(f"[synclib] FAILED: {exc}", file=sys.stderr, flush=True)
            print("[synclib] the jobs that finished are kept: fix the cause and run the same command again to "
                  "resume", file=sys.stderr, flush=True)
            return 1
    print(f"[synclib] finished in {time.perf_counter() - t0:.0f} s", flush=True)
    if "book" in jobs:
        print(f"[synclib] the book: {display(jobs['book'].output)}", flush=True)
    return 0
