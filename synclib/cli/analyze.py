"""``synclib analyze CUBE --out RESULT``: :func:`synclib.analysis.analyze` on a cube
file, written to netCDF.

The options' defaults are the run-config schema's (:func:`synclib.config.default`).
:mod:`synclib.analysis` (and with it torch) is imported when the command runs, not for
``--help``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from synclib import argtypes as at
from synclib.config import default

__all__ = ["configure_parser", "run"]


def _conditions(text: str) -> list[str]:
    from synclib.analysis.samples import AnalysisError, parse_condition

    conds = [c.strip() for c in text.split(",") if c.strip()]
    if not conds:
        raise ValueError("no conditions")
    for c in conds:
        try:
            parse_condition(c)
        except AnalysisError as exc:
            raise ValueError(str(exc)) from None
    return conds


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``synclib analyze``; defaults are the configuration schema's (:mod:`synclib.config`)."""
    seeds = ",".join(str(s) for s in default("analysis.split_seeds"))
    p.add_argument("cube", help="activation cube (.nc) written by `synclib simulate`")
    p.add_argument("--out", required=True, help="result file (.nc) to write")
    p.add_argument("--conditions", type=at.arg_type(_conditions, "conditions"), default=None,
                   help="comma-separated conditions: genuine, passive, shuffled, pseudo (pseudo-dyads), lagJ "
                        "(default: all of them, with lags 1 and 2)")
    p.add_argument("--alpha", type=at.arg_type(at.ridge_alpha, "alpha"), default=default("analysis.alpha"),
                   help="ridge penalty, or 'cv' for episode-grouped CV per source layer (default: %(default)s)")
    p.add_argument("--n-samples", type=at.arg_type(at.nonneg_int, "sample count"),
                   default=default("analysis.n_samples"),
                   help="fixed sample size per dataset; 0 = all (default: %(default)s)")
    p.add_argument("--split-seeds", type=at.arg_type(at.seed_list, "split seeds"), default=seeds,
                   help="split seeds, e.g. 0,1,2 (default: %(default)s)")
    p.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default: cpu)")
    p.add_argument("--precision", default=default("analysis.precision"), choices=["float32", "tf32", "bf16"],
                   help="matmul precision of the big products (default: %(default)s)")
    p.add_argument("--persona-disjoint", action="store_true", help="also the persona-disjoint split (table 2)")
    p.add_argument("--relationship", action="store_true", help="also relationship subsets (appendix G)")
    p.add_argument("--sample-sizes", type=at.arg_type(lambda t: at.int_list(t, 2), "sample sizes"), default="",
                   help="comma-separated sample sizes for the appendix D sweep (default: none)")
    p.add_argument("--nonlinear", action="store_true", help="also the 2-layer MLP comparison (appendix I)")
    p.add_argument("--nonlinear-epochs", type=at.arg_type(at.positive_int, "epochs"),
                   default=default("analysis.nonlinear_epochs"), help="MLP epochs (default: %(default)s)")
    p.add_argument("--nonlinear-batch-size", type=at.arg_type(at.nonneg_int, "batch size"),
                   default=default("analysis.nonlinear_batch_size"),
                   help="MLP minibatch size; 0 = full batch (default: %(default)s)")
    p.add_argument("--n-boot", type=at.arg_type(at.nonneg_int, "resamples"), default=default("analysis.n_boot"),
                   help="resamples of whole episodes for the dialog-level tests; 0 = none (default: %(default)s)")
    p.add_argument("--tom", action="store_true", help="also ToM decoding (appendix J; needs the ToM variables)")
    p.add_argument("--equal-samples", action="store_true",
                   help="fit every condition at the smallest condition's sample counts (ours; the reference "
                        "splits each condition's own samples), each also on all its samples")
    p.add_argument("--surrogates", type=at.arg_type(at.nonneg_int, "surrogates"), default=0,
                   help="also genuine against this many surrogate partners per dialog (ours; "
                        f"the main job's default: {default('analysis.surrogates')}); 0 = none (default: %(default)s)")
    p.add_argument("--max-resident-gib", type=at.arg_type(at.nonneg_float, "GiB"),
                   default=float(default("analysis.max_resident_gib")),
                   help="hidden-state variables up to this size (GiB) are loaded whole; larger ones "
                        "stream from disk, each fit reading only its rows (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``synclib analyze``."""
    from synclib.analysis.core import analyze
    from synclib.analysis.samples import AnalysisError
    from synclib.cube import open_cube
    from synclib.splits import RidgeInputError

    out = Path(args.out)
    try:
        cube = open_cube(args.cube)
    except (FileNotFoundError, ValueError) as e:
        print(f"synclib analyze: {e}", file=sys.stderr)
        return 2
    try:
        res = analyze(
            cube, **({"conditions": args.conditions} if args.conditions else {}), alpha=args.alpha,
            n_samples=args.n_samples or None, split_seeds=args.split_seeds, device=args.device,
            precision=args.precision, persona_disjoint=args.persona_disjoint, relationship=args.relationship,
            sample_sizes=args.sample_sizes or None, nonlinear=args.nonlinear,
            nonlinear_options={"epochs": args.nonlinear_epochs,
                               "batch_size": args.nonlinear_batch_size or None},
            n_boot=args.n_boot, tom=args.tom, equal_samples=args.equal_samples, surrogates=args.surrogates,
            max_resident_bytes=int(args.max_resident_gib * 2**30),
            progress=not args.no_progress)
    except (AnalysisError, RidgeInputError) as e:
        print(f"synclib analyze: {e}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    res.to_netcdf(tmp)
    os.replace(tmp, out)
    print(f"wrote {out}")
    for c in res.condition.values:  # the pair: mean of the directions, band = mean of their SEs (fig 4b)
        print(f"  SyncR2(A,B) {c}: {float(res.sync_r2.sel(condition=c).mean()):.3f} "
              f"± {float(res.sync_r2_se.sel(condition=c).mean()):.3f}")
    return 0
