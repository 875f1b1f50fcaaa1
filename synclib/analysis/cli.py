"""``synclib analyze CUBE --out RESULT``: :func:`~synclib.analysis.analyze` on a cube
file, written to netCDF."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from synclib.analysis.core import analyze
from synclib.analysis.samples import AnalysisError
from synclib.cube import open_cube
from synclib.ridge import RidgeInputError

__all__ = ["configure_parser", "run"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``synclib analyze``."""
    p.add_argument("cube", help="activation cube (.nc) written by `synclib simulate`")
    p.add_argument("--out", required=True, help="result file (.nc) to write")
    p.add_argument("--conditions", default="genuine,passive,lag1,lag2",
                   help="comma-separated conditions: genuine, passive, lagJ (default: %(default)s)")
    p.add_argument("--alpha", default="0.1",
                   help="ridge penalty, or 'cv' for episode-grouped CV per source layer (default: %(default)s)")
    p.add_argument("--n-samples", type=int, default=6500,
                   help="fixed sample size per dataset; 0 = all (default: %(default)s)")
    p.add_argument("--split-seeds", default="0,1,2", help="comma-separated split seeds (default: %(default)s)")
    p.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default: cpu)")
    p.add_argument("--precision", default="float32", choices=["float32", "tf32", "bf16"],
                   help="matmul precision of the big products (default: %(default)s)")
    p.add_argument("--persona-disjoint", action="store_true", help="also the persona-disjoint split (table 2)")
    p.add_argument("--relationship", action="store_true", help="also relationship subsets (appendix G)")
    p.add_argument("--sample-sizes", default="",
                   help="comma-separated sample sizes for the appendix D sweep (default: none)")
    p.add_argument("--nonlinear", action="store_true", help="also the 2-layer MLP comparison (appendix I)")
    p.add_argument("--nonlinear-epochs", type=int, default=200, help="MLP epochs (default: %(default)s)")
    p.add_argument("--nonlinear-batch-size", type=int, default=64,
                   help="MLP minibatch size; 0 = full batch (default: %(default)s)")
    p.add_argument("--tom", action="store_true", help="also ToM decoding (appendix J; needs the ToM variables)")
    p.add_argument("--max-resident-gib", type=float, default=2.0,
                   help="hidden-state variables up to this size (GiB) are loaded whole; larger ones "
                        "stream from disk, each fit reading only its rows (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def run(args: argparse.Namespace) -> int:
    """Entry point of ``synclib analyze``."""
    alpha = args.alpha if args.alpha == "cv" else float(args.alpha)
    if args.max_resident_gib < 0:
        print(f"synclib analyze: --max-resident-gib must be >= 0, got {args.max_resident_gib}", file=sys.stderr)
        return 2
    try:
        cube = open_cube(args.cube)
    except (FileNotFoundError, ValueError) as e:
        print(f"synclib analyze: {e}", file=sys.stderr)
        return 2
    try:
        res = analyze(
            cube, conditions=[c.strip() for c in args.conditions.split(",") if c.strip()], alpha=alpha,
            n_samples=args.n_samples or None, split_seeds=_ints(args.split_seeds), device=args.device,
            precision=args.precision, persona_disjoint=args.persona_disjoint, relationship=args.relationship,
            sample_sizes=_ints(args.sample_sizes) or None, nonlinear=args.nonlinear,
            nonlinear_options={"epochs": args.nonlinear_epochs,
                               "batch_size": args.nonlinear_batch_size or None},
            tom=args.tom, max_resident_bytes=int(args.max_resident_gib * 2**30),
            progress=not args.no_progress)
    except (AnalysisError, RidgeInputError) as e:
        print(f"synclib analyze: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    res.to_netcdf(tmp)
    os.replace(tmp, out)
    print(f"wrote {out}")
    for c in res.condition.values:
        print(f"  SyncR2(A,B) {c}: {float(res.sync_r2_pair_mean.sel(condition=c)):.3f} "
              f"± {float(res.sync_r2_pair_se.sel(condition=c)):.3f}")
    return 0
