"""Command-line interface: ``synclib SUBCOMMAND ...``.

Each subcommand is a module of this package (:data:`SUBCOMMANDS`) with ``configure_parser(parser)`` (its
options, their defaults read from :func:`synclib.config.default`) and ``run(args) -> int``; the work is done by
the library modules they call, which never import this package. A module is imported when its subcommand is
used, and imports the heavy libraries (torch, transformers) only when it runs, so that ``synclib --help`` stays
fast (the "lazy" imports of these modules).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from synclib import __version__

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "simulate": ("synclib.cli.simulate", "two models role-play Sotopia tasks; write an activation cube"),
    "analyze": ("synclib.cli.analyze", "compute SyncR^2 grids and scores from a cube"),
    "evaluate": ("synclib.cli.evaluate", "judge episodes on Sotopia-eval's seven dimensions"),
    "run": ("synclib.cli.run", "the main job: simulate, judge, analyse, execute notebooks, build the book"),
    "notebooks": ("synclib.cli.notebooks", "re-execute chosen notebooks (papermill) against a results directory"),
    "fetch": ("synclib.cli.fetch", "fetch a dataset (the paper's Sotopia tasks) into the user's cache"),
    "bench": ("synclib.cli.bench", "measure one ordered run's dialog loop on this machine, for the dry run's price"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="synclib",
        description="Neural synchrony between socially interacting language models.",
    )
    parser.add_argument("--version", action="version", version=f"synclib {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if only is None or name == only:
            mod = importlib.import_module(module)
            mod.configure_parser(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    parser = build_parser(only=chosen)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    mod = importlib.import_module(args._module)
    try:
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted; finished work is on disk and a re-run resumes it", file=sys.stderr)
        return 130
