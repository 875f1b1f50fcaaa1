"""Synchrony over the dialog (ours; the paper scores whole dialogs only).

Does synchrony build up, stay or fade as a dialog goes on?  The analysis fits each split's
maps on all rounds of its training episodes and scores them on the test samples of one round
at a time (``sync_r2_round``; the rule is the analysis' ``round_rule`` attribute,
:data:`synclib.analysis.blocks.ROUND_RULE`), also on every resample of whole episodes
(``sync_r2_round_boot``, the draws of the dialog-level tests).  This module pools them per
model pair and tests the trend:

* :func:`round_table`: per unit (pair, or ordered run), condition and round, the SyncR² of
  that round (mean over the unit's ordered runs and directions) with its 95 % interval over
  the episode resamples and the test samples it rests on;
* :func:`trend_table`: per unit and condition, the least-squares slope of those values on
  the round number, over the rounds with at least :data:`MIN_TEST_SAMPLES` test samples,
  with its interval and two-sided p over the same resamples (each resample's slope), and that
  p Holm-adjusted over every trend of the table (the family the page words its verdicts from).

A round's SyncR² scores each source layer at the target layer chosen on the whole test set
(``round_tgt_layer``), without a clip, so no maximum is taken over a round's few samples, a
round can be negative, and the rounds' values average, weighted by their samples, to the whole
test set's unclipped SyncR² (``sync_r2_noclip``).  A round
is shown only where every direction of the unit has it (agent 2's reply to agent 1's last turn
has no next state, so the last round has one direction only and is left out).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from synclib import stats

__all__ = ["MIN_TEST_SAMPLES", "round_table", "trend_table", "has_rounds"]

#: rounds whose test samples (mean over the split seeds, runs and directions) are fewer are left
#: out of the trend and drawn hollow.  Nothing is chosen on a round (its targets are the whole test
#: set's), so a thin round is noisy, as its interval shows, not biased: the floor only drops rounds
#: too thin to score (with equal samples the default run has 8-9 per round and split)
MIN_TEST_SAMPLES = 5

_INFO = ["pair", "family", "model_a", "model_b", "orders"]
ROUND_COLUMNS = _INFO + ["condition", "round", "mean", "ci_lo", "ci_hi", "n_test", "kept"]
TREND_COLUMNS = _INFO + ["condition", "slope", "ci_lo", "ci_hi", "p", "p_holm", "n_rounds", "first_round",
                         "last_round", "first", "last", "n_boot", "n_episodes"]


def has_rounds(res) -> bool:
    """True when every run's analysis has the scores per round."""
    return bool(res.runs) and all("sync_r2_round" in res.analysis(n) for n in res.run_names)


def _unit_rounds(res, runs, condition: str) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The unit's per-round values (R,), resamples (B, R) or None, and mean test samples (R,):
    means over its ordered runs and directions, NaN for a round some direction lacks (agent 2's
    reply to agent 1's last turn has no next state); the counts: over split seeds, runs and
    directions."""
    vals, boots, ns = [], [], []
    for r in runs:
        ds = res.analysis(r.name)
        if condition not in ds["condition"].values:
            continue
        vals.append(ds["sync_r2_round"].sel(condition=condition).transpose("direction", "round").to_numpy())
        ns.append(ds["n_test_round"].sel(condition=condition).mean("split_seed").transpose("direction", "round")
                  .to_numpy().astype(float))
        if "sync_r2_round_boot" in ds:
            boots.append(ds["sync_r2_round_boot"].sel(condition=condition)
                         .transpose("direction", "boot", "round").to_numpy())
    if not vals:
        return np.array([]), None, np.array([])
    value = np.mean(np.concatenate(vals), axis=0)  # every direction, or NaN: both directions in every round shown
    boot = np.mean(np.concatenate(boots), axis=0) if len(boots) == len(vals) else None
    return value, boot, np.mean(np.concatenate(ns), axis=0)


def _kept(value: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The rounds (R,) a unit's trend uses: scored, on at least :data:`MIN_TEST_SAMPLES` test samples."""
    return np.isfinite(value) & (n >= MIN_TEST_SAMPLES)


def round_table(res, conditions=None, separate: bool = False) -> pd.DataFrame:
    """SyncR² per round of the test episodes, per unit and condition.

    Parameters
    ----------
    res : synclib.results.Results
    conditions : sequence of str, optional
        Default: every condition of the runs (:meth:`synclib.results.Results.conditions`).
    separate : one row per ordered run instead of per pair.

    Returns
    -------
    DataFrame
        ``pair, family, model_a, model_b, orders, condition``; ``round`` (1-based, the
        source state's round: agent 1's k-th turn, or agent 2's reply to it); ``mean`` (the
        round's SyncR², mean over the unit's ordered runs and directions), ``ci_lo``,
        ``ci_hi`` (2.5 and 97.5 percentiles over the episode resamples; NaN without them),
        ``n_test`` (test samples of the round, mean over split seeds, runs and directions; a
        round some direction lacks has no row)
        and ``kept`` (``n_test >= MIN_TEST_SAMPLES``).  Empty without the per-round scores, and
        where no round was scored (too few samples): ``attrs["has_rounds"]`` tells which.
    """
    if not has_rounds(res):
        return pd.DataFrame(columns=ROUND_COLUMNS)
    rows = []
    for cond in conditions or res.conditions():
        for _, runs in res.units(separate):
            value, boot, n = _unit_rounds(res, runs, cond)
            kept = _kept(value, n)
            for k in np.flatnonzero(np.isfinite(value)):
                lo, hi = stats.bootstrap_interval(boot[:, k]) if boot is not None else (math.nan, math.nan)
                rows.append({**res.unit_info(runs, separate), "condition": cond, "round": int(k) + 1,
                             "mean": float(value[k]), "ci_lo": lo, "ci_hi": hi, "n_test": float(n[k]),
                             "kept": bool(kept[k])})
    out = pd.DataFrame(rows, columns=ROUND_COLUMNS)
    out.attrs["has_rounds"] = True  # the runs have the scores: an empty table means no round was scored
    return out


def _slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slopes of ``y`` (..., n) on ``x`` (n,)."""
    xc = x - x.mean()
    return (y - y.mean(axis=-1, keepdims=True)) @ xc / (xc @ xc)


def trend_table(res, conditions=None, separate: bool = False) -> pd.DataFrame:
    """The trend of SyncR² over the rounds, per unit and condition.

    Returns
    -------
    DataFrame
        ``pair, family, model_a, model_b, orders, condition``; ``slope`` (least-squares
        slope of the round's SyncR² on the round number, per round, over the kept rounds of
        :func:`round_table`), ``ci_lo``, ``ci_hi`` (2.5 and 97.5 percentiles of the slope over
        the episode resamples), ``p`` (two-sided, :func:`synclib.stats.bootstrap_p`: that the
        slope is 0), ``p_holm`` (``p`` Holm-adjusted over every row's, :func:`synclib.stats.holm`:
        the family of trend tests the page shows), ``n_rounds``, ``first_round``, ``last_round`` (the kept rounds),
        ``first``, ``last`` (their values), ``n_boot`` (resamples with every kept round
        scored) and ``n_episodes`` (episodes of the first run's cube).  NaN where fewer than
        three rounds are kept; a condition no round of any unit scored has no rows.
    """
    if not has_rounds(res):
        return pd.DataFrame(columns=TREND_COLUMNS)
    rows = []
    for cond in conditions or res.conditions():
        units = [(runs, _unit_rounds(res, runs, cond)) for _, runs in res.units(separate)]
        if any(np.isfinite(value).any() for _, (value, _, _) in units):
            rows += [_trend_row(res, runs, cond, *rounds, separate) for runs, rounds in units]
    out = pd.DataFrame(rows, columns=TREND_COLUMNS)
    out["p_holm"] = stats.holm(out["p"].to_numpy(float)) if len(out) else out["p"]
    return out


def _trend_row(res, runs, cond: str, value: np.ndarray, boot: np.ndarray | None, n: np.ndarray,
               separate: bool) -> dict:
    """One row of :func:`trend_table` from the unit's :func:`_unit_rounds`."""
    kept = np.flatnonzero(_kept(value, n))
    row = {**res.unit_info(runs, separate), "condition": cond, "slope": math.nan, "ci_lo": math.nan,
           "ci_hi": math.nan, "p": math.nan, "p_holm": math.nan, "n_rounds": len(kept), "first_round": math.nan,
           "last_round": math.nan, "first": math.nan, "last": math.nan, "n_boot": 0,
           "n_episodes": int(res.analysis(runs[0].name).attrs.get("n_episodes", 0))}
    if len(kept) >= 3:
        x = kept + 1.0  # rounds are 1-based on the pages
        row.update(slope=float(_slope(x, value[kept])), first_round=int(x[0]), last_round=int(x[-1]),
                   first=float(value[kept[0]]), last=float(value[kept[-1]]))
        if boot is not None:
            b = boot[:, kept]
            slopes = _slope(x, b[np.isfinite(b).all(axis=1)])
            lo, hi = stats.bootstrap_interval(slopes)
            row.update(ci_lo=lo, ci_hi=hi, p=stats.bootstrap_p(slopes), n_boot=int(slopes.size))
    return row
