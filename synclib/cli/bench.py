"""``synclib bench``: one ordered run's dialog loop measured on this machine (:mod:`synclib.run.bench`), kept
in ``RESULTS/bench/`` where the dry run prices the grid from it. A few minutes: the models load, one part plays."""
from __future__ import annotations

import argparse
import sys

from synclib.config import ConfigError, load_config
from synclib.paths import DEFAULT_CONFIG, display
from synclib.run import bench
from synclib.run.pipeline import runs, select_runs
from synclib.tasks.datasets import TASK_SETS, DatasetError, fetch, is_cached

__all__ = ["configure_parser", "run"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``synclib bench``."""
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="YAML run config (default: config/default.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, as synclib run does (repeatable)")
    p.add_argument("--run", default=None, metavar="RUN",
                   help="the ordered run to measure, by name (M1-L2) or position (synclib run --list-runs; "
                        "default: the first)")
    p.add_argument("--tasks", type=int, default=None,
                   help="tasks to play (default: simulate.units_per_part, one part as full as the run's)")
    p.add_argument("--seeds", type=int, default=1, help="simulation seeds per task (default 1)")


def run(args: argparse.Namespace) -> int:
    """Measure, keep and summarise the record; 0 when done, 2 on a bad config or option."""
    try:
        cfg = load_config(args.config, args.overrides)
        if args.tasks is not None and args.tasks < 1:
            raise ConfigError(f"--tasks: {args.tasks} is not a number of tasks >= 1")
        if args.seeds < 1 or args.seeds > len(cfg["simulate"]["seeds"]):
            raise ConfigError(f"--seeds: {args.seeds}: the config simulates {len(cfg['simulate']['seeds'])} seed(s)")
        run_ = select_runs(cfg, [args.run])[0] if args.run is not None else runs(cfg)[0]
        ds = TASK_SETS.get(cfg["scenarios"])
        if ds is not None and not is_cached(ds):
            fetch(ds)
    except (ConfigError, DatasetError) as exc:
        print(f"synclib bench: {exc}", file=sys.stderr)
        return 2
    print(f"[synclib] bench: {run_.name} of {cfg['name']!r} ({cfg['models'][run_.a]['spec']} and "
          f"{cfg['models'][run_.b]['spec']}), one part on this machine", flush=True)
    record = bench.measure(cfg, run_, tasks=args.tasks, seeds=args.seeds)
    out = bench.write(cfg, record)
    r = next(iter(record["results"].values()))
    mode, m = next(iter(r["modes"].items()))
    where = record["machine"].get("gpu") or f"{record['machine']['cpu_count']} CPU cores"
    print(f"[synclib] bench: {m['utterances']} utterances generated and {m['reads']} read in {m['wall_s']:.0f} s "
          f"({m['utterances_per_s']:.2f} utterances/s, {mode} scheduling, {m['rows_per_step']:.1f} rows per decoding "
          f"step) on {where}; the models loaded in {m['load_s']:.0f} s", flush=True)
    print(f"[synclib] bench: kept in {display(out)}; `synclib run --config {args.config} --dry-run` prices the grid "
          "from it", flush=True)
    return 0
