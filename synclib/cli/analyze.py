"""``synclib analyze CUBE --out RESULT``: :func:`synclib.analysis.analyze` on a cube
file, written to netCDF.

The settings are those of a run config (``--config``, mapped by
:meth:`synclib.analysis.AnalysisSettings.from_config`, the main job's one mapping), else the
run-config schema's defaults (:func:`synclib.config.default`) with the optional blocks off; an
option given on the command line overrides either.
:mod:`synclib.analysis` (and with it torch) is imported when the command runs, not for
``--help``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from synclib import argtypes as at
from synclib.analysis.samples import AnalysisError, parse_condition
from synclib.config import ConfigError, default, load_config
from synclib.cube import open_cube
from synclib.keys import section_defaults
from synclib.penalty import check_alphas
from synclib.splits import RidgeInputError

__all__ = ["configure_parser", "run"]


def _conditions(text: str) -> list[str]:
    conds = [c.strip() for c in text.split(",") if c.strip()]
    if not conds:
        raise ValueError("no conditions")
    for c in conds:
        try:
            parse_condition(c)
        except AnalysisError as exc:
            raise ValueError(str(exc)) from None
    return conds


#: the optional blocks, off unless asked for when no --config is given
_BLOCKS_OFF = dict(persona_disjoint=False, relationship=False, sample_sizes=None, nonlinear=False, tom=False,
                   surrogates=0, planted=0)


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``synclib analyze``; each defaults to the config's value (``--config``, else the
    schema's, :mod:`synclib.config`), so only the options given change it."""
    d = default
    cv = at.arg_type(at.ridge_alpha, "alpha")
    on_off = argparse.BooleanOptionalAction
    p.add_argument("cube", help="activation cube (.nc) written by `synclib simulate`")
    p.add_argument("--out", required=True, help="result file (.nc) to write")
    p.add_argument("--config", default=None,
                   help="run config (YAML) whose analysis.* settings to use, as the main job does "
                        "(default: the schema's defaults, with the optional blocks off)")
    p.add_argument("--conditions", type=at.arg_type(_conditions, "conditions"), default=None,
                   help="comma-separated conditions: genuine, passive, shuffled, pseudo (pseudo-dyads), lagJ "
                        "(default: all of them, with --lags)")
    p.add_argument("--lags", type=at.setting("analysis.lags"), default=None, metavar="LIST",
                   help=f"lag controls, e.g. 1,2; empty: none (default: {','.join(map(str, d('analysis.lags')))})")
    p.add_argument("--alpha", type=cv, default=None,
                   help="ridge penalty, or 'cv' for episode-grouped CV per source layer "
                        f"(default: {d('analysis.alpha')})")
    p.add_argument("--cv-alphas", type=at.arg_type(_positive_floats, "cv alphas"), default=None,
                   help="alpha=cv: the grid, multiples of each source layer's scale "
                        "(default: 1e-3 .. 1e3, half decades)")
    p.add_argument("--cv-folds", type=at.setting("analysis.cv_folds"), default=None, metavar="N",
                   help=f"alpha=cv: folds over whole episodes (default: {d('analysis.cv_folds')})")
    p.add_argument("--cv-columns", type=at.setting("analysis.cv_columns", zero=True), default=None, metavar="N",
                   help=f"alpha=cv: target columns per layer in the criterion; 0 = all "
                        f"(default: {d('analysis.cv_columns')})")
    p.add_argument("--cv-seed", type=at.setting("analysis.cv_seed"), default=None, metavar="SEED",
                   help=f"alpha=cv: seed of the folds and columns (default: {d('analysis.cv_seed')})")
    p.add_argument("--n-samples", type=at.setting("analysis.n_samples", zero=True), default=None, metavar="N",
                   help=f"fixed sample size per dataset; 0 = all (default: {d('analysis.n_samples')})")
    p.add_argument("--split-seeds", type=at.setting("analysis.split_seeds"), default=None, metavar="LIST",
                   help=f"split seeds, e.g. 0,1,2 (default: {','.join(map(str, d('analysis.split_seeds')))})")
    p.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default: the config's, else cpu)")
    p.add_argument("--precision", type=at.setting("analysis.precision"), default=None, metavar="float32|tf32|bf16",
                   help=f"matmul precision of the big products (default: {d('analysis.precision')})")
    p.add_argument("--persona-disjoint", action=on_off, default=None, help="also the persona-disjoint split (table 2)")
    p.add_argument("--relationship", action=on_off, default=None, help="also relationship subsets (appendix G)")
    p.add_argument("--sample-sizes", type=at.setting("analysis.sample_sizes"), default=None, metavar="LIST",
                   help="comma-separated sample sizes for the appendix D sweep; empty or none: none (default: none)")
    p.add_argument("--nonlinear", action=on_off, default=None, help="also the 2-layer MLP comparison (appendix I)")
    p.add_argument("--nonlinear-epochs", type=at.setting("analysis.nonlinear_epochs"), default=None, metavar="N",
                   help=f"MLP epochs (default: {d('analysis.nonlinear_epochs')})")
    p.add_argument("--nonlinear-batch-size", type=at.setting("analysis.nonlinear_batch_size", zero=True), default=None,
                   metavar="N",
                   help=f"MLP minibatch size; 0 = full batch (default: {d('analysis.nonlinear_batch_size')})")
    p.add_argument("--nonlinear-seeds", type=at.setting("analysis.nonlinear_seeds", zero=True), default=None,
                   metavar="N",
                   help="fit the MLPs on the first this many split seeds only; 0 = all (default: all)")
    p.add_argument("--n-boot", type=at.setting("analysis.n_boot"), default=None, metavar="N",
                   help=f"resamples of whole episodes for the dialog-level tests; 0 = none "
                        f"(default: {d('analysis.n_boot')})")
    p.add_argument("--tom", action=on_off, default=None, help="also ToM decoding (appendix J; needs the ToM variables)")
    p.add_argument("--tom-format-filter", action=on_off, default=None,
                   help="ToM decoding: drop samples whose target reply did not follow the 'Emotion. Action type.' "
                        f"format (the protocol; default: {str(d('analysis.tom_format_filter')).lower()})")
    p.add_argument("--surrogates", type=at.setting("analysis.surrogates"), default=None, metavar="N",
                   help="also genuine against this many surrogate partners per dialog (ours; "
                        f"the main job's default: {d('analysis.surrogates')}); 0 = none (default: 0)")
    p.add_argument("--planted", type=at.setting("analysis.planted"), default=None, metavar="N",
                   help="also this many re-splits with planted differences, the power page's curve (ours; "
                        f"the main job's default: {d('analysis.planted')}); 0 = none (default: 0)")
    p.add_argument("--max-resident-gib", type=at.setting("analysis.max_resident_gib"), default=None, metavar="GIB",
                   help="hidden-state variables up to this size (GiB) are loaded whole; larger ones "
                        f"stream from disk, each fit reading only its rows (default: {d('analysis.max_resident_gib')})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _positive_floats(text: str) -> list[float]:
    """``"0.1,1,10"`` -> ``[0.1, 1.0, 10.0]`` (checked by :func:`synclib.penalty.check_alphas`)."""
    return list(check_alphas([float(x) for x in text.split(",") if x.strip()]))


def settings_from_args(args: argparse.Namespace):
    """The :class:`~synclib.analysis.AnalysisSettings` of ``synclib analyze``: the config's
    (:meth:`~synclib.analysis.AnalysisSettings.from_config` of ``--config``, else of the schema's
    defaults with the optional blocks off), overridden by each option given."""
    # lazy: torch loads only when the command runs (synclib --help stays light)
    from synclib.analysis import AnalysisSettings

    if args.config:
        base = AnalysisSettings.from_config(load_config(args.config))
    else:
        base = AnalysisSettings.from_config(section_defaults("analysis")).replace(**_BLOCKS_OFF)
    given = {
        "conditions": args.conditions, "lags": args.lags, "alpha": args.alpha, "cv_alphas": args.cv_alphas,
        "cv_folds": args.cv_folds, "cv_seed": args.cv_seed, "split_seeds": args.split_seeds,
        "device": args.device, "precision": args.precision, "persona_disjoint": args.persona_disjoint,
        "relationship": args.relationship, "nonlinear": args.nonlinear, "n_boot": args.n_boot, "tom": args.tom,
        "surrogates": args.surrogates, "planted": args.planted, "cv_columns": args.cv_columns,
        "n_samples": args.n_samples, "nonlinear_seeds": args.nonlinear_seeds}
    options = {k: at.value_of(v) for k, v in given.items() if v is not None}
    if args.conditions is not None and args.lags is None:
        options["lags"] = None  # the conditions as given
    if args.sample_sizes is not None:
        options["sample_sizes"] = at.value_of(args.sample_sizes)  # empty or none: none
    mlp = {} if args.nonlinear_epochs is None else {"epochs": args.nonlinear_epochs}
    if args.nonlinear_batch_size is not None:
        mlp["batch_size"] = at.value_of(args.nonlinear_batch_size)
    if mlp:
        options["nonlinear_options"] = mlp
    if args.tom_format_filter is not None:
        options["tom_options"] = {**(base.tom_options or {}), "format_filter": args.tom_format_filter}
    if args.max_resident_gib is not None:
        options["max_resident_bytes"] = int(args.max_resident_gib * 2**30)
    return base.replace(**options)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``synclib analyze``."""
    # lazy: torch loads only when the command runs (synclib --help stays light)
    from synclib.analysis.core import analyze

    out = Path(args.out)
    try:
        cube = open_cube(args.cube)
    except (FileNotFoundError, ValueError) as e:
        print(f"synclib analyze: {e}", file=sys.stderr)
        return 2
    try:
        res = analyze(cube, settings_from_args(args), progress=not args.no_progress)
    except (AnalysisError, RidgeInputError, ConfigError) as e:
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
