"""Figures 3-4: the passive reader, the shuffled and lagged controls and our pseudo-dyads and surrogates (section 4.2).

The notebook ``notebooks/fig03_04_controls.md`` draws this page from the functions here, section
by section:

* figures 3, 4a, 4b: :func:`control_table`, :func:`lag_table` (the heatmaps, bars and lines are
  the shared charts :func:`heatmap_grid`, :func:`grouped_bars`, :func:`lines_with_se`);
* every contrast on the same rows (ours): :func:`contrast_table`, :func:`sentence_contrasts`;
* surrogate partners (ours): :func:`surrogate_table` (:mod:`synclib.analysis.power`), :func:`surrogate_frame`,
  :func:`surrogate_strip`, :func:`sentence_surrogates`; the pseudo-dyads: :func:`sentence_pseudo`;
* synchrony over the dialog (ours): :func:`round_table`, :func:`trend_table`, :func:`rounds_lines`,
  :func:`sentence_rounds`;
* linear CKA (ours): :func:`cka_frame`, :func:`cka_table`, :func:`sentence_cka`;
* the paired tests run by run: :func:`paired_tests_by_run` (:mod:`synclib.analysis.power`),
  :func:`format_by_run`, :func:`by_run_sentence`;
* the page's sentence beside the paper (:func:`sentence_controls`) and its claims (``CLAIMS``:
  :func:`passive`, :func:`lags`, :func:`shuffled`, :func:`pseudo`).
"""
from __future__ import annotations

import math
import warnings

import altair as alt
import numpy as np
import pandas as pd

from synclib import stats
from synclib.analysis import power
from synclib.figures.charts import (WRAPPED_LABEL, colour_scale, need_columns, placeholder_if_empty, grouped_bars,
                                    heatmap_grid, lines_with_se)
from synclib.figures.verdicts import AGREES, CANNOT, DIFFERS, Claim, Measure, p_test, significant, test_link, who
from synclib.analysis.power import (paired_tests_by_run, reported_difference, significantly_above,
                           surrogate_table, surrogate_test)
from synclib.analysis.cka import unrelated_cka
from synclib.analysis.results import grid_frame
from synclib.figures.report import (ASSUMED_PAPER_DIFFERENCE, empty_note, interval_text, join_words, paper_note,
                                    passive_share, readable)
from synclib.stats import fmt as _f
from synclib.stats import format_p
from synclib.stats import p_clause as _p

__all__ = ["control_table", "lag_table", "cka_frame", "cka_table", "contrast_table", "surrogate_table",
           "surrogate_frame", "MIN_TEST_SAMPLES", "has_rounds", "round_table", "trend_table", "surrogate_strip",
           "rounds_lines", "heatmap_grid", "grouped_bars", "lines_with_se", "readable", "sentence_controls",
           "sentence_cka", "sentence_contrasts", "sentence_pseudo", "sentence_surrogates", "sentence_rounds",
           "paired_tests_by_run", "format_by_run", "by_run_sentence", "why_untestable", "passive", "lags",
           "shuffled", "pseudo", "CLAIMS"]


# --------------------------------------------------------------------------- tables: figures 4a, 4b; CKA
def control_table(res, conditions=None) -> pd.DataFrame:
    """Figure 4a: per family and condition, the mean of the pairs' SyncR² and the
    reference's error bar (:func:`synclib.stats.reference_family_se`).

    ``conditions`` default: genuine, passive and shuffled, those the run has.
    """
    if conditions is None:
        conditions = [c for c in ("genuine", "passive", "shuffled") if c in res.conditions()]
    n_split = len((res.config.get("analysis") or {}).get("split_seeds") or [0, 1, 2])
    rows = []
    for cond in conditions:
        t = res.sync_table(cond)
        for fam, sub in t.groupby("family", sort=False):
            v = sub["mean"].to_numpy(float)
            ok = np.isfinite(v)
            rows.append({"family": fam, "condition": cond,
                         "mean": float(v[ok].mean()) if ok.any() else math.nan,
                         "se": stats.reference_family_se(v, n_split), "n_pairs": int(ok.sum())})
    return pd.DataFrame(rows, columns=["family", "condition", "mean", "se", "n_pairs"])

def lag_table(res) -> pd.DataFrame:
    """Figure 4b: SyncR² per pair at lag k = 0 (genuine), 1, 2, ... (columns
    ``pair, family, ..., k, mean, se``; se the mean of the directional SEs)."""
    conds = res.conditions()
    lags = [(0, "genuine")] + sorted((int(c[3:]), c) for c in conds
                                     if c.startswith("lag") and c[3:].isdigit())
    rows = []
    for _, runs in res.units():
        for k, cond in lags:
            rows.append({**res.unit_info(runs), "k": k, **res.unit_value(runs, condition=cond)})
    return pd.DataFrame(rows)

def cka_frame(res, name: str, condition: str = "genuine", direction: str = "A->B") -> pd.DataFrame:
    """Linear CKA per layer pair of one ordered run (the analysis' ``cka``, on all samples
    of the dataset), with each source layer's most similar target.

    Returns
    -------
    DataFrame
        ``src_layer, tgt_layer, cka, best`` (layers 1-based as :meth:`synclib.analysis.results.Results.heatmap_frame`,
        padding dropped); empty when the analysis lacks ``cka`` or ``condition``.
    """
    ds = res.analysis(name)
    if "cka" not in ds or condition not in ds["condition"].values:
        return pd.DataFrame(columns=["src_layer", "tgt_layer", "cka", "best"])
    return grid_frame(ds["cka"].sel(condition=condition, direction=direction), "cka")

def cka_table(res, separate: bool = False) -> pd.DataFrame:
    """Per pair (or ordered run) and condition: linear CKA beside SyncR².

    Returns
    -------
    DataFrame
        ``pair, family, model_a, model_b, orders, condition``; ``mean`` (CKA averaged over
        every layer pair, then over the unit's directional values: both directions of each
        order), ``best`` (per source layer the most similar target, averaged over source
        layers, then likewise), ``se`` (NaN: one value per dataset, no split seeds),
        ``sync_r2`` (the unit's SyncR², :meth:`synclib.analysis.results.Results.sync_table`), ``n_min``, ``n_max`` (the
        fewest and most samples of its datasets: CKA uses them all) and ``n_values``.
        Empty when no run's analysis has ``cka``.
    """
    cols = ["pair", "family", "model_a", "model_b", "orders", "condition", "mean", "best", "se", "sync_r2",
            "n_min", "n_max", "n_values"]
    if not all("cka" in res.analysis(n) for n in res.run_names):
        return pd.DataFrame(columns=cols)
    rows = []
    for cond in res.conditions():
        sync = res.sync_table(cond, separate).set_index("pair")["mean"]
        for unit, runs in res.units(separate):
            grids = [res.analysis(r.name)["cka"].sel(condition=cond, direction=d).to_numpy()
                     for r in runs for d in res.analysis(r.name)["direction"].values]
            ns = [int(res.analysis(r.name)["n_available"].sel(condition=cond, direction=d))
                  for r in runs for d in res.analysis(r.name)["direction"].values]
            with warnings.catch_warnings():  # padding rows and columns are NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                mean = np.array([np.nanmean(g) for g in grids])
                best = np.array([np.nanmean(np.nanmax(g, axis=1)) for g in grids])
            ok = np.isfinite(mean)
            rows.append({**res.unit_info(runs, separate), "condition": cond,
                         "mean": float(mean[ok].mean()) if ok.any() else math.nan,
                         "best": float(best[ok].mean()) if ok.any() else math.nan, "se": math.nan,
                         "sync_r2": float(sync.get(unit, math.nan)), "n_min": min(ns), "n_max": max(ns),
                         "n_values": int(ok.sum())})
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------- every contrast on the same rows (ours)
# Each control is fitted twice: on its own samples (``sync_r2``, the paper's design and figures 3-4) and,
# beside genuine, on the rows both hold (the contrast, ``sync_r2_contrast_pooled``; the rule is the
# analysis' ``contrast_rule`` attribute, :data:`synclib.analysis.contrasts.CONTRAST_RULE`).  Every test and
# claim of a control uses the contrast.
def contrast_table(res) -> pd.DataFrame:
    """Per pair and control: genuine and the control on the rows both hold (the contrast: equal
    episodes, positions and counts), beside each on all its own samples, and the training samples
    behind each (mean over directions, split seeds and runs).

    Returns
    -------
    DataFrame
        ``pair, family, model_a, model_b, orders, control``; ``genuine``, ``control_value``,
        ``gap`` (the contrast: genuine minus control on the same rows); ``genuine_all``,
        ``control_all``, ``gap_all`` (each on all its own samples); ``genuine_moved``
        (``genuine - genuine_all``: what the control's rows alone do to genuine);
        ``n_train`` (each side of the contrast, equal), ``n_train_genuine_all``,
        ``n_train_control_all``.  Empty where the analyses have no contrasts.
    """
    cols = ["pair", "family", "model_a", "model_b", "orders", "control", "genuine", "control_value", "gap",
            "genuine_all", "control_all", "gap_all", "genuine_moved", "n_train", "n_train_genuine_all",
            "n_train_control_all"]
    if not res.runs or len(res.runs_with("sync_r2_contrast_pooled")) < len(res.runs):
        return pd.DataFrame(columns=cols)

    def train(runs, var, **sel):
        return float(np.mean([res.analysis(r.name)[var].sel(**sel).mean() for r in runs]))

    rows = []
    for _, runs in res.units():
        g_all = res.unit_value(runs, "sync_r2", condition="genuine")["mean"]
        for c in res.conditions():
            if c == "genuine":
                continue
            g, v = (res.unit_value(runs, "sync_r2_contrast_pooled", contrast=c, side=side)["mean"]
                    for side in ("genuine", "control"))
            c_all = res.unit_value(runs, "sync_r2", condition=c)["mean"]
            rows.append({**res.unit_info(runs), "control": c, "genuine": g, "control_value": v, "gap": g - v,
                         "genuine_all": g_all, "control_all": c_all, "gap_all": g_all - c_all,
                         "genuine_moved": g - g_all,
                         "n_train": train(runs, "n_train_contrast", contrast=c, side="genuine"),
                         "n_train_genuine_all": train(runs, "n_train", condition="genuine"),
                         "n_train_control_all": train(runs, "n_train", condition=c)})
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------- surrogate partners (ours)
def surrogate_frame(res) -> pd.DataFrame:
    """Per pair, each surrogate's SyncR² and genuine's on the same rows (:func:`synclib.analysis.power.surrogate_test`),
    for :func:`surrogate_strip`: columns ``pair``, ``kind`` ("surrogate" or "genuine"), ``surrogate`` (its
    index; -1 for genuine), ``value``."""
    rows = []
    for p in res.pair_names:
        t = surrogate_test(res, [r.name for r in res.runs_of(p)])
        if not t["n_runs"]:
            continue
        rows += [{"pair": p, "kind": "surrogate", "surrogate": m, "value": float(v)}
                 for m, v in enumerate(t["surrogates"]) if np.isfinite(v)]
        rows.append({"pair": p, "kind": "genuine", "surrogate": -1, "value": t["genuine"]})
    return pd.DataFrame(rows, columns=["pair", "kind", "surrogate", "value"])


# --------------------------------------------------------------------------- synchrony over the dialog (ours)
# The paper scores whole dialogs only.  Does synchrony build up, stay or fade as a dialog goes on?
# The analysis fits each split's maps on all rounds of its training episodes and scores them on
# the test samples of one round at a time (``sync_r2_round``; the rule is the analysis' ``round_rule`` attribute,
# :data:`synclib.analysis.blocks.ROUND_RULE`), also on every resample of whole episodes
# (``sync_r2_round_boot``, the draws of the dialog-level tests).  These functions pool them per
# model pair and test the trend:
#
# * :func:`round_table`: per unit (pair, or ordered run), condition and round, the SyncR² of
#   that round (mean over the unit's ordered runs and directions) with its 95 % interval over
#   the episode resamples and the test samples it rests on;
# * :func:`trend_table`: per unit and condition, the least-squares slope of those values on
#   the round number, over the rounds with at least :data:`MIN_TEST_SAMPLES` test samples,
#   with its interval and two-sided p over the same resamples (each resample's slope), and that
#   p Holm-adjusted over every trend of the table (the family the page words its verdicts from).
#
# A round's SyncR² scores each source layer at the target layer chosen on the whole test set
# (``round_tgt_layer``), without a clip, so no maximum is taken over a round's few samples, a
# round can be negative, and the rounds' values average, weighted by their samples, to the whole
# test set's unclipped SyncR² (``sync_r2_noclip``).  A round
# is shown only where every direction of the unit has it (agent 2's reply to agent 1's last turn
# has no next state, so the last round has one direction only and is left out).

#: rounds whose test samples (mean over the split seeds, runs and directions) are fewer are left
#: out of the trend and drawn hollow.  Nothing is chosen on a round (its targets are the whole test
#: set's), so a thin round is noisy, as its interval shows, not biased: the floor only drops rounds
#: too thin to score
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
    res : synclib.analysis.results.Results
    conditions : sequence of str, optional
        Default: every condition of the runs (:meth:`synclib.analysis.results.Results.conditions`).
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


# --------------------------------------------------------------------------- charts
@placeholder_if_empty
def rounds_lines(frame: pd.DataFrame, title: str, column: str = "pair", wrap: int = 2) -> alt.Chart:
    """SyncR² per round (:func:`round_table`): a line per condition with its
    interval as a band, one panel per ``column``; points of rounds too thin for the trend
    (``kept`` false) hollow.

    Parameters
    ----------
    frame : DataFrame
        Columns ``round``, ``condition``, ``mean``, ``ci_lo``, ``ci_hi``, ``n_test``, ``kept``
        and ``column``.
    """
    need_columns(frame, ["round", "condition", "mean", "ci_lo", "ci_hi", "n_test", "kept", column], "rounds_lines")
    xs = alt.X("round:O", title="round of the dialog", axis=alt.Axis(labelAngle=0))
    color = alt.Color("condition:N", title="condition", sort=None, scale=colour_scale(frame["condition"]),
                      legend=alt.Legend(orient="bottom", columns=4, symbolOpacity=1, symbolType="circle"))
    tips = [alt.Tooltip(f"{column}:N"), alt.Tooltip("condition:N"), alt.Tooltip("round:O"),
            alt.Tooltip("mean:Q", format=".3f", title="SyncR²"), alt.Tooltip("ci_lo:Q", format=".3f"),
            alt.Tooltip("ci_hi:Q", format=".3f"), alt.Tooltip("n_test:Q", format=".1f", title="test samples")]
    band = alt.Chart().mark_area(opacity=0.15).encode(x=xs, y=alt.Y("ci_lo:Q", title="SyncR² of the round"),
                                                       y2="ci_hi:Q", color=color)
    line = alt.Chart().mark_line().encode(x=xs, y="mean:Q", color=color)
    points = alt.Chart().mark_point(size=40).encode(
        x=xs, y="mean:Q", color=color, tooltip=tips,
        fill=alt.condition("datum.kept", alt.Color("condition:N", sort=None, legend=None,
                                                   scale=colour_scale(frame["condition"])),
                           alt.value("white")))
    layered = alt.layer(band, line, points, data=frame).properties(width=220)
    panels = list(dict.fromkeys(frame[column]))
    return layered.facet(facet=alt.Facet(f"{column}:N", title=None, sort=panels), columns=wrap).properties(title=title)


@placeholder_if_empty
def surrogate_strip(frame: pd.DataFrame, title: str, y_title: str = "SyncR²") -> alt.LayerChart:
    """Each pair's surrogate values as grey points and its genuine value as a red bar: ``frame``
    with columns ``pair``, ``kind`` ("surrogate" or "genuine"), ``surrogate`` and ``value``."""
    need_columns(frame, ["pair", "kind", "value"], "surrogate_strip")
    xs = alt.X("pair:N", title="model pair", sort=None, axis=alt.Axis(labelAngle=0, labelExpr=WRAPPED_LABEL))
    tips = [alt.Tooltip("pair:N"), alt.Tooltip("kind:N"), alt.Tooltip("value:Q", format=".3f")]
    pts = alt.Chart(frame[frame["kind"] == "surrogate"]).mark_circle(size=40, opacity=0.6, color="grey").encode(
        x=xs, y=alt.Y("value:Q", title=y_title), xOffset=alt.XOffset("jitter:Q"), tooltip=tips + ["surrogate:O"]
    ).transform_calculate(jitter="random()")
    gen = alt.Chart(frame[frame["kind"] == "genuine"]).mark_tick(color="firebrick", thickness=3, size=40).encode(
        x=xs, y="value:Q", tooltip=tips)
    return alt.layer(pts, gen).properties(title=title, width=320)


# --------------------------------------------------------------------------- sentences
def _versus(sync: pd.DataFrame, other: pd.DataFrame, what: str,
            where: str = "the tests are in the table above and the claims below") -> str:
    m = sync[["pair", "mean"]].merge(other[["pair", "mean"]], on="pair", suffixes=("_g", "_c"))
    m = m[np.isfinite(m["mean_g"]) & np.isfinite(m["mean_c"])]
    if m.empty:
        return (f"No pair of this run has a SyncR² both genuine and with {what} (too few samples to fit the maps), "
                "so they cannot be compared.")
    lower = int((m["mean_c"] < m["mean_g"]).sum())
    return (f"With {what} SyncR² is lower than in the genuine interaction for {lower} of {len(m)} "
            f"pairs (the mean over pairs of each pair's SyncR²: {_f(m['mean_g'].mean())} genuine vs "
            f"{_f(m['mean_c'].mean())}; {where}).")


def sentence_controls(control: pd.DataFrame, lag: pd.DataFrame, sync: pd.DataFrame,
                      passive: pd.DataFrame | None, published: dict,
                      shuffled: pd.DataFrame | None = None) -> str:
    """Passive and shuffled vs genuine per pair (None: the run lacks that condition), and
    the change from lag 0 to the largest lag."""
    if passive is None:
        s1 = "This run has no passive-reader condition (`simulate.passive` was off)."
    else:
        s1 = _versus(sync, passive, "the passive reader")
        if share := passive_share(sync, passive):
            s1 += (f" {share[0].upper()}{share[1:]}: that much of what the maps predict comes from the input "
                   "the two share, and only the rest needs the agent to take part in the dialog.")
    if shuffled is not None:
        s1 += (" " + _versus(sync, shuffled, "the shuffled control (training targets permuted "
                             "within each dialog, the paper's code's control)"))
    kmax = int(lag["k"].max()) if len(lag) else 0
    k0 = lag[lag["k"] == 0]["mean"].mean() if kmax > 0 else math.nan
    kk = lag[lag["k"] == kmax]["mean"].mean() if kmax > 0 else math.nan
    if kmax > 0 and np.isfinite(k0) and np.isfinite(kk):
        word = "falls" if kk < k0 else "rises"
        s2 = f" From lag k = 0 to k = {kmax}, the mean SyncR² over pairs {word} from {_f(k0)} to {_f(kk)}."
    elif kmax > 0:
        s2 = f" The run has lags up to k = {kmax}, but no SyncR² at lag 0 and k = {kmax} to compare (too few samples)."
    else:
        s2 = " This run has no lagged conditions."
    p = published["fig3_4"]
    return s1 + s2 + paper_note(p, p["claim_passive"] + " " + p["claim_lag"])


def sentence_cka(table: pd.DataFrame, embedded: bool, synthetic: bool = False, res=None) -> str:
    """Linear CKA (ours; the paper has none) per condition, and whether it orders genuine
    against each control as SyncR² does (:func:`cka_table`); with ``res``, what the estimator gives
    for unrelated states at the run's sample counts and widths
    (:func:`synclib.analysis.cka.unrelated_cka`)."""
    if table.empty:
        return ("This run's analysis files lack `cka` (they were written before synclib computed CKA): "
                "re-analyse the cubes to add it.")
    by = table.groupby("condition", sort=False)[["mean", "sync_r2"]].mean()
    parts = [f"{_f(by.loc[c, 'mean'])} {c}" for c in by.index]
    s = (f"Linear CKA between one agent's states and the partner's next states (every layer pair, on all "
         f"{_span(table['n_min'].min(), table['n_max'].max())} samples of each dataset: nothing is fitted, so no "
         f"split), averaged over layer pairs, directions and pairs: {join_words(parts)}.")
    if "genuine" in by.index:
        g = by.loc["genuine"]
        orders = []
        for c in (c for c in by.index if c != "genuine"):
            cka_word, sync_word = ("above" if g["mean"] > by.loc[c, "mean"] else "below",
                                   "above" if g["sync_r2"] > by.loc[c, "sync_r2"] else "below")
            orders.append(f"{c}: CKA puts genuine {cka_word} it, SyncR² {sync_word} "
                          f"({_f(g['sync_r2'])} vs {_f(by.loc[c, 'sync_r2'])}), "
                          + ("the same order" if cka_word == sync_word else "opposite orders"))
        if orders:
            s += " Against each control, " + "; ".join(orders) + "."
    if res is not None and len(widths := res.model_table()["width"].dropna()):
        d = int(widths.min()), int(widths.max())
        lo, hi = int(table["n_min"].min()), int(table["n_max"].max())
        s += (f" This linear CKA (Kornblith et al.'s estimator) is not 0 for unrelated states: independent random "
              f"states {d[0]} and {d[1]} wide score {_f(unrelated_cka(hi, *d))} at {hi} samples and "
              f"{_f(unrelated_cka(lo, *d))} at {lo}, and fewer samples score higher, so the conditions are "
              "compared with each other only, and a condition with fewer samples (a lag) gains from that alone.")
    return (s + f" These are {_whose(embedded, synthetic)}, never the paper's: the paper reports no CKA (a second "
            "measure, ours).")


def _whose(embedded: bool, synthetic: bool) -> str:
    return ("numbers from synthetic test data" if synthetic else "the embedded tiny models' numbers" if embedded
            else "this run's models' numbers")


def sentence_contrasts(table: pd.DataFrame, embedded: bool, synthetic: bool = False) -> str:
    """What the contrasts show (:func:`contrast_table`): per control, the gap on the rows both hold
    beside the gap of the conditions each on its own samples, and how far genuine moves on the
    control's rows."""
    if table.empty:
        return ("This run's analyses have no contrasts (they predate them, or the run has no control): re-analyse "
                "the cubes. Without them genuine and a control differ in their samples as well as their targets.")
    parts = []
    for control, t in table.groupby("control", sort=False):
        parts.append(f"{control}: genuine {_f(t['genuine'].mean())} against {_f(t['control_value'].mean())} on "
                     f"{_f(t['n_train'].mean(), 0)} training samples each (gap {_f(t['gap'].mean(), 3)}); on their own "
                     f"samples genuine {_f(t['genuine_all'].mean())} ({_f(t['n_train_genuine_all'].mean(), 0)}) and "
                     f"the control {_f(t['control_all'].mean())} ({_f(t['n_train_control_all'].mean(), 0)}), gap "
                     f"{_f(t['gap_all'].mean(), 3)}; on the control's rows genuine moves by "
                     f"{_f(t['genuine_moved'].mean(), 3, sign=True)}")
    return ("Each control against genuine on the rows both hold, the mean over pairs: " + "; ".join(parts) + ". "
            "A contrast splits the rows by genuine's own split, so both sides have the same training and test "
            "episodes and source positions and differ only in their targets (the passive reader: in whose state is "
            "read); each side chooses its own penalty. Where genuine moves, the positions a control lacks (a lag "
            "has no pair at the dialog's last rounds) carry part of genuine's synchrony, so a gap between "
            "conditions on their own samples mixes the control with the positions. The tests and claims of this "
            f"page and the first page use the contrasts; figures 3-4 show each condition on its own samples, as "
            f"the paper does. These are {_whose(embedded, synthetic)}; the paper fixes 6,500 samples for every "
            "condition, each on its own.")


def sentence_pseudo(sync: pd.DataFrame, pseudo: pd.DataFrame | None, partners: list[str], embedded: bool,
                    synthetic: bool = False) -> str:
    """The pseudo-dyads (ours) against genuine per pair (:meth:`synclib.analysis.results.Results.sync_table`),
    with the partner rule the analyses used (their ``pseudo_partner`` attribute)."""
    if pseudo is None or pseudo.empty:
        return ("This run has no pseudo-dyads (`analysis.pseudo_dyads` was off, or the analysis files predate them): "
                "re-analyse the cubes to add them.")
    rule = join_words(sorted(set(partners))) or "not recorded"
    return (f"Here the partner dialog is {rule}. "
            + _versus(sync, pseudo, "pseudo-dyads", "the paired tests are in the table of paired tests below, the "
                      "claim at the end of the page")
            + f" These are {_whose(embedded, synthetic)}; the paper has no pseudo-dyads (ours, after the "
            "hyperscanning literature's control).")


def sentence_surrogates(table: pd.DataFrame, embedded: bool, synthetic: bool = False) -> str:
    """Genuine against its surrogate partners per pair (:func:`synclib.analysis.power.surrogate_table`),
    with the persona confound where the surrogates change the personas."""
    if table is None or table.empty:
        return empty_note("surrogate partners", "sync_r2_surrogate", table)
    parts = []
    for r in table.itertuples():
        above = int(round(r.share_below * r.n_surrogates))
        p = f"; {stats.p_clause(r.p)}, the floor {_f(r.p_floor, 3)}" if np.isfinite(r.p) else ""
        ci = (f", 95 % interval {_f(r.ci_lo, 3)} to {_f(r.ci_hi, 3)}" if np.isfinite(r.ci_lo) else "")
        parts.append(f"{'over all runs' if r.pair == 'all' else r.pair} genuine {_f(r.genuine)} is above "
                     f"{above} of its {r.n_surrogates} surrogates (their mean {_f(r.surrogate_mean)}, at most "
                     f"{_f(r.surrogate_max)}; gap {_f(r.gap, 3)}{ci}{p})")
    same = float(np.nanmean(table["same_personas"]))
    n_seeds = int(table["n_sim_seeds"].min())
    confound = (f"In {_f(100 * (1 - same), 0)} % of the surrogate samples the partner dialog has other personas "
                "(and mostly another scenario)"
                + (": the run has one simulation seed, so no surrogate keeps the task. The gap therefore mixes "
                   "the exchange itself with what a dialog's own personas and scenario text share; the same task "
                   "under two or more simulation seeds would separate them." if n_seeds < 2 else
                   "; the first surrogates of each dialog are the same task under the other simulation seeds, "
                   "which keep the personas and the scenario."))
    return (f"Against the surrogate distribution: {join_words(parts)}. The p is the larger of genuine's rank among "
            f"the surrogates and the bootstrap of the gap over whole episodes; the floor is the smallest p the rank "
            f"can give, 1 / (1 + the surrogates). Each surrogate chose its own penalty by the analysis' rule, as "
            f"genuine did. {confound} These are "
            f"{_whose(embedded, synthetic)}; the paper has no surrogates (ours, after hyperscanning practice).")


def sentence_rounds(rounds: pd.DataFrame, trend: pd.DataFrame, embedded: bool, synthetic: bool = False) -> str:
    """Synchrony per round of the test episodes and its trend (:func:`round_table`, :func:`trend_table`)."""
    if rounds.empty and rounds.attrs.get("has_rounds"):
        return ("No round of the test episodes has a SyncR² in this run (too few samples to fit the maps).")
    if rounds.empty:
        return ("This run's analysis files lack `sync_r2_round` (they predate the scores per round): re-analyse "
                "the cubes to add them.")

    def trend_of(condition: str) -> str:
        parts = []
        for _, t in trend[trend["condition"] == condition].iterrows():
            if not np.isfinite(t["slope"]):
                parts.append(f"{t['pair']}: too few rounds with {MIN_TEST_SAMPLES} or more test samples for a trend")
                continue
            verdict = ("shows no detectable trend" if not (np.isfinite(t["p_holm"]) and t["p_holm"] < 0.05)
                       else "rises" if t["slope"] > 0 else "falls")
            parts.append(f"{t['pair']}: from {_f(t['first'])} in round {int(t['first_round'])} to {_f(t['last'])} in "
                         f"round {int(t['last_round'])}, {verdict} (slope {_f(t['slope'], 3)} per round, 95 % "
                         f"interval {_f(t['ci_lo'], 3)} to {_f(t['ci_hi'], 3)}, {stats.p_clause(t['p_holm'])} "
                         f"Holm-adjusted ({stats.p_clause(t['p'])} alone), over {int(t['n_boot'])} resamples of "
                         f"{int(t['n_episodes'])} episodes)")
        return "; ".join(parts)

    pseudo = (f" The pseudo-dyads (agents of different dialogs): {trend_of('pseudo')}."
              if (trend["condition"] == "pseudo").any() else "")
    thin = rounds[~rounds["kept"]]
    left = (f" Rounds with fewer than {MIN_TEST_SAMPLES} test samples (mean over split seeds) are drawn hollow and "
            f"left out of the trend ({len(thin)} of {len(rounds)} points)." if len(thin) else "")
    n = rounds[rounds["condition"] == "genuine"]["n_test"]
    family = int(np.isfinite(trend["p"].astype(float)).sum())
    return ("Genuine SyncR² per round of the test episodes, the maps fitted on all rounds of the training episodes, "
            "each source layer scored at the target layer chosen on the whole test set, without a clip (so a "
            "round can be below 0, and the rounds average to the unclipped SyncR²): "
            + trend_of("genuine") + f". A round rests on {_f(n.min(), 0)}–{_f(n.max(), 0)} test samples per split; "
            f"the p-values are Holm-adjusted over the {family} trend tests of this page's table (every pair and "
            "condition), and a trend counts where the adjusted p is below 0.05."
            + pseudo + left + f" These are {_whose(embedded, synthetic)}; the paper scores whole dialogs only (ours).")


def _span(lo, hi) -> str:
    return f"{int(lo)}" if int(lo) == int(hi) else f"{int(lo)}–{int(hi)}"


# --------------------------------------------------------------------------- the paired tests, run by run
def _f3(x) -> str:
    """A number of the paired tests' table and sentences: three decimals."""
    return _f(x, 3)


def format_by_run(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`synclib.analysis.power.paired_tests_by_run` for display: one row per run and control, the reported
    SyncR² (reference aggregation, directions averaged) and both tests (:data:`synclib.analysis.power.TWO_TESTS`)."""
    def fp(p):
        return format_p(p) if np.isfinite(p) else "—"

    boot = table["sync_diff"].notna()
    out = pd.DataFrame({
        "run": table["run"], "genuine vs": table["control"],
        "genuine": table["sync_genuine"].where(boot, table["mean_genuine"]).map(_f3),
        "control": table["sync_control"].where(boot, table["mean_control"]).map(_f3),
        "difference": table.apply(reported_difference, axis=1).map(_f3),
        "95 % interval (episodes)": table.apply(interval_text, axis=1),
        "p (re-splits)": table["p_corrected"].map(fp), "p (episodes)": table["p_episodes"].map(fp),
        "min. detectable difference": table["mde_corrected"].map(_f3)})
    return out.set_index(["run", "genuine vs"])


def by_run_sentence(table: pd.DataFrame, embedded: bool) -> str:
    """One sentence per ordered run of :func:`synclib.analysis.power.paired_tests_by_run`: which controls its
    genuine SyncR² is significantly above (p < 0.05 by the larger p of the two tests,
    :data:`synclib.analysis.power.TWO_TESTS`), and which not."""
    who = "the embedded models show" if embedded else "this run shows"
    out = []
    for run, t in table.groupby("run", sort=False):
        if run == "all runs":
            continue
        above = [f"{r['control']} (by {_f3(reported_difference(r))}, {_p(r['p'])})" for _, r in t.iterrows()
                 if significantly_above(r)]
        rest = [f"{r['control']} ({_p(r['p'])})" for _, r in t.iterrows() if not significantly_above(r)]
        first = t.iloc[0] if len(t) else None
        g = (first["sync_genuine"] if first is not None and np.isfinite(first["sync_genuine"])
             else first["mean_genuine"] if first is not None else math.nan)
        s = f"In {run}, {who} genuine SyncR² {_f3(g)}"
        s += (f", significantly above {', '.join(above)}" if above else ", above no control significantly")
        s += (f"; not significantly above {', '.join(rest)}." if rest else ".")
        out.append(s)
    return " ".join(out) + (f" Each p is the larger of two tests ({test_link('the test')})." if out else "")


def why_untestable(row) -> str | None:
    """Why the comparison ``row`` allows no test, in a clause for the first page; None if it does."""
    n = int(row["n_pairs"])
    if n < 2:
        return f"{n} paired value(s), too few for a test"
    if not np.isfinite(row["mde"]):
        same = (f"are equal in all {n} paired values (both {_f3(row['mean_genuine'])})" if row["mean_diff"] == 0
                else f"differ by the same {_f3(row['mean_diff'])} in all {n} paired values")
        return f"genuine and {row['control']} {same}, so no test or detectable size is defined"
    return None


# --------------------------------------------------------------------------- claims of the paper
def _found(r) -> str:
    """``"by 0.033 SyncR² (95 % interval 0.012 to 0.055 over episodes), p = 0.0042 (test)"``: the p that counts
    (the larger of the two tests, described once on the power page: :func:`synclib.figures.verdicts.test_link`)."""
    ci = interval_text(r)
    ci = f" (95 % interval {ci} over episodes)" if ci != "—" else ""
    return f"by {_f(power.reported_difference(r), 3)} SyncR²{ci}, {p_test(r['p'])}"


def _measure(r, control: str) -> tuple:
    """The scorecard's number of a control's claim: the gap genuine minus ``control`` with its interval and p."""
    return (Measure(f"gap to {control}", power.reported_difference(r), r.get("ci_lo", math.nan),
                    r.get("ci_hi", math.nan), r["p"], label=control, unit="SyncR²"),)


def _control_line(res, table, control: str, key: str, what: str, paper_difference: float | None) -> Claim:
    rows = table[table["control"] == control] if len(table) else table
    if not len(rows):
        return Claim(key, what, CANNOT, f"this run has no {control} condition.")
    r = rows.iloc[0]
    if why := why_untestable(r):
        return Claim(key, what, CANNOT, why + ".")
    m = _measure(r, control)
    if significant(r["p"]) and power.reported_difference(r) > 0:
        return Claim(key, what, AGREES, f"{who(res)} genuine above {control} {_found(r)}.", m)
    mde = r["mde_corrected"]
    if significant(r["p"]):  # significant, but genuine below the control
        return Claim(key, what, DIFFERS, f"{who(res)} genuine below {control} {_found(r)}.", m)
    if paper_difference is not None and np.isfinite(mde) and mde <= paper_difference:
        return Claim(key, what, DIFFERS, (
            f"not found, where a difference of {_f(paper_difference)} SyncR² (assumed; the paper prints no number) "
            f"would be detected from about {_f(mde, 3)}: {_found(r)}."), m)
    return Claim(key, what, CANNOT, f"not detected: {_found(r)}; this run detects differences from about "
                                    f"{_f(mde, 3)} only.", m)


def passive(res, published: dict, paper_difference: float = ASSUMED_PAPER_DIFFERENCE, table=None) -> Claim:
    """Figures 3-4a: the passive reader is below genuine."""
    table = power.paired_control_tests(res) if table is None else table
    return _control_line(res, table, "passive", "fig3_4", "Passive reader below genuine (section 4.2, figure 4a)",
                         paper_difference)


def lags(res, published: dict, table=None) -> Claim:
    """Figures 3-4b: synchrony collapses at lags 1 and 2."""
    table = power.paired_control_tests(res) if table is None else table
    what = "Synchrony collapses at lags k = 1, 2 (section 4.2, figure 4b)"
    rows = table[table["control"].str.startswith("lag")] if len(table) else table
    if not len(rows):
        return Claim("fig3_4", what, CANNOT, "this run has no lagged condition.")
    parts = [_control_line(res, table, c, "fig3_4", "", None) for c in rows["control"]]
    verdict = (AGREES if all(p.verdict == AGREES for p in parts) else
               DIFFERS if any(p.verdict == DIFFERS for p in parts) else CANNOT)
    text = "; ".join(f"{c}: {p.text.rstrip('.')}" for c, p in zip(rows["control"], parts))
    return Claim("fig3_4", what, verdict, text + ".", tuple(m for p in parts for m in p.measures))


def shuffled(res, published: dict, table=None) -> Claim:
    """The code's shuffled control (the paper does not report it)."""
    table = power.paired_control_tests(res) if table is None else table
    return _control_line(res, table, "shuffled", "fig3_4",
                         "The paper's code's shuffled control below genuine (not reported in the paper)", None)


def pseudo(res, published: dict, table=None) -> Claim:
    """Ours: pseudo-dyads (agents that never talked to each other) below genuine."""
    table = power.paired_control_tests(res) if table is None else table
    return _control_line(res, table, "pseudo", "fig3_4",
                         "Pseudo-dyads, agents of different dialogs, below genuine (ours; not in the paper)", None)


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((passive, "fig3_4"), (lags, "fig3_4"), (shuffled, "fig3_4"), (pseudo, "fig3_4"),)
