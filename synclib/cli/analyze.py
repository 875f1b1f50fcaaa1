"""``synclib analyze CUBE --out RESULT``: :func:`synclib.analysis.analyze` on a cube file, written to netCDF.

Each ``analysis.*`` key is an option of its name (``analysis.cv_folds``: ``--cv-folds``). The settings are
``--config``'s, else the keys' defaults, with each option given replacing its key, mapped as the main job maps
them (:meth:`synclib.analysis.AnalysisSettings.from_config`).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from synclib.cli import argtypes as at
from synclib.analysis.samples import AnalysisError, parse_condition
from synclib.config import ConfigError, load_config
from synclib.cube import open_cube, var_name
from synclib.keys import KEYS, _inline_yaml, default, section_defaults
from synclib.splits import RidgeInputError

__all__ = ["configure_parser", "run", "settings_from_args"]

#: the analysis.* keys, each an option of its name
_KEYS = tuple(k for k in KEYS if k.path.startswith("analysis."))
#: the options whose 0 is the key's null ("all", "full batch")
_ZERO_IS_NULL = ("n_samples", "cv_columns", "nonlinear_batch_size", "nonlinear_seeds")
#: the blocks that re-use the genuine fits, as a key turns them off
_NEED_GENUINE = {"persona_disjoint": False, "relationship": False, "sample_sizes": None, "nonlinear": False,
                 "surrogates": 0, "planted": 0}


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


def _metavar(allowed: str) -> str:
    """An option's metavar from its key's rule in words."""
    if "list" in allowed:
        return "LIST"
    if allowed.startswith("one of "):
        return allowed[len("one of "):].replace("'", "").replace(", ", "|")
    return "N" if "integer" in allowed else "X|cv" if "'cv'" in allowed else "X"


def _shown(value) -> str:
    """A default as the option would take it: ``1,2``, ``13 values, 0.001 to 1000``, ``null``."""
    if isinstance(value, list):
        return f"{len(value)} values, {min(value):g} to {max(value):g}" if len(value) > 4 else \
            ",".join(map(str, value))
    return _inline_yaml(value)


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``synclib analyze``: the few that are no key, then one per ``analysis.*`` key."""
    p.add_argument("cube", help="activation cube (.nc) written by `synclib simulate`")
    p.add_argument("--out", required=True, help="result file (.nc) to write")
    p.add_argument("--config", default=None,
                   help="run config (YAML) whose settings to use, as the main job does (default: the keys' "
                        "defaults, those of a config that sets none)")
    p.add_argument("--conditions", type=at.arg_type(_conditions, "conditions"), default=None,
                   help="comma-separated conditions: genuine, passive, shuffled, pseudo (pseudo-dyads), lagJ "
                        "(default: all of them, pseudo with --pseudo-dyads, lagJ with --lags)")
    p.add_argument("--device", type=at.setting("device"), default=None,
                   help="torch device of the fits, e.g. cpu or cuda (default: the config's device, else auto)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    keyed = p.add_argument_group("settings", "--NAME sets the config key analysis.NAME; [the key's default, "
                                              "which --config replaces by its own]")
    for key in _KEYS:
        name = key.path.split(".", 1)[1]
        zero = name in _ZERO_IS_NULL
        help_ = f"{key.help} [{_shown(default(key.path))}{'; 0 is null' if zero else ''}]".replace("%", "%%")
        flag = "--" + name.replace("_", "-")
        if key.check.allowed == "true or false":
            keyed.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            keyed.add_argument(flag, type=at.setting(key.path, zero=zero), default=None,
                               metavar=_metavar(key.check.allowed), help=help_)


def settings_from_args(args: argparse.Namespace):
    """The :class:`~synclib.analysis.AnalysisSettings` of ``synclib analyze``. With ``--conditions`` without
    ``genuine``, the blocks that need it are off unless asked for."""
    # lazy: torch loads only when the command runs
    from synclib.analysis import AnalysisSettings

    if args.config:
        cfg = load_config(args.config)
    else:
        cfg = {**section_defaults("analysis"), **section_defaults("simulate"), "device": default("device")}
    if args.conditions is not None and "genuine" not in args.conditions:
        cfg["analysis"].update({n: off for n, off in _NEED_GENUINE.items() if getattr(args, n) is None})
    for key in _KEYS:
        name = key.path.split(".", 1)[1]
        if getattr(args, name) is not None:
            cfg["analysis"][name] = at.value_of(getattr(args, name))
    if args.tom:
        cfg["simulate"]["tom"] = True  # asked for: the cube's ToM dialogs, whatever the config simulated
    if args.device is not None:
        cfg["device"] = args.device
    settings = AnalysisSettings.from_config(cfg)
    if args.conditions is not None:  # the conditions as given, with --lags' lag conditions if given
        settings = settings.replace(conditions=args.conditions, lags=None if args.lags is None else settings.lags)
    return settings


def run(args: argparse.Namespace) -> int:
    """Entry point of ``synclib analyze``."""
    # lazy: torch loads only when the command runs
    from synclib.analysis.core import analyze
    from synclib.analysis.tom import ToMError  # lazy, as analyze

    out = Path(args.out)
    try:
        cube = open_cube(args.cube)
    except (FileNotFoundError, ValueError) as e:
        print(f"synclib analyze: {e}", file=sys.stderr)
        return 2
    try:
        settings = settings_from_args(args)
        if settings.tom and not args.tom and var_name("hidden", "a", "tom") not in cube.variables:
            print("synclib analyze: the cube has no ToM dialogs: no ToM decoding", file=sys.stderr)
            settings = settings.replace(tom=False)
        res = analyze(cube, settings, progress=not args.no_progress)
    except (AnalysisError, RidgeInputError, ConfigError, ToMError) as e:
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
