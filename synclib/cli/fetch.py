"""``synclib fetch NAME``: a dataset into the user's cache (:func:`synclib.tasks.datasets.fetch`), then its use."""
from __future__ import annotations

import argparse
import sys

from synclib.tasks.datasets import CACHE_ENV, DATASETS, DatasetError, fetch

__all__ = ["configure_parser", "run"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """``synclib fetch NAME [--from DIR_OR_ARCHIVE]``."""
    parser.add_argument("name", choices=sorted(DATASETS),
                        help="the dataset: sotopia (the paper's Sotopia tasks) or sotopia-human (published "
                             "human Sotopia-eval ratings, for table 4 and figure 10)")
    parser.add_argument("--from", dest="source", default=None, metavar="DIR_OR_ARCHIVE",
                        help="copy the files from a folder or a zip/tar archive you brought instead of downloading "
                             "(checked against the same hashes)")
    parser.add_argument("--url", default=None, help="a mirror's base URL (default: the pinned source)")
    parser.add_argument("--cache", default=None,
                        help=f"the cache root (default ${CACHE_ENV}, else the user cache)")


def run(args: argparse.Namespace) -> int:
    """``synclib fetch``: 0 when the files are in the cache, 2 when fetching failed."""
    ds = DATASETS[args.name]
    try:
        root = fetch(ds, args.source, cache=args.cache, url=args.url, log=lambda m: print(m, flush=True))
    except DatasetError as exc:
        print(f"synclib fetch: {exc}", file=sys.stderr)
        return 2
    if ds.kind == "tasks":
        print(f"{ds.name}: {len(ds.files)} files ready in {root} (use `scenarios: {ds.name}`)")
    else:
        # lazy: pandas loads only when the command runs
        from synclib.judge.sotopia_human import usage

        print(f"{ds.name}: {len(ds.files)} files ready in {root}\n{usage(root)}")
    return 0
