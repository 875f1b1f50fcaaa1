"""The power page: what this run's size can detect, and why a claim cannot be tested.

The notebook ``notebooks/power.md`` draws this page from the functions here:

* the paired tests of genuine against each control (:func:`paired_control_tests`, per split
  seed and with the seeds averaged, and :func:`run_sample_sizes`, both of :mod:`synclib.analysis.power`)
  as one narrow table (:func:`format_table`);
* which differences planted in the run's own states its test finds
  (:func:`synclib.analysis.power.planted_power`), drawn with the shared :func:`lines_with_se`
  (:func:`power_chart`) beside its table (:func:`format_curve`);
* the page's argument, generated from those numbers (:func:`claims_text`), on what the
  controls' comparisons can and cannot show; the difference taken as the paper's is
  :data:`synclib.figures.report.ASSUMED_PAPER_DIFFERENCE` (shared with figures 3-4's claims);
* the one full description of the tests every claim's p comes from (:func:`test_description`,
  under the label :data:`synclib.figures.verdicts.TEST_LABEL` that every claim's "test" links to).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from synclib.analysis.power import (detection_size, n_pairs_needed, paired_control_tests, planted_power,
                                    run_sample_sizes, surrogate_test)
from synclib.figures.charts import lines_with_se
from synclib.figures.report import ASSUMED_PAPER_DIFFERENCE, interval_text, sample_counts_text
from synclib.stats import fmt, format_p
from synclib.stats import p_clause as _p

__all__ = ["ASSUMED_PAPER_DIFFERENCE", "paired_control_tests", "run_sample_sizes", "sample_counts_text",
           "planted_power", "power_chart", "format_curve", "format_table", "claims_text", "surrogate_test",
           "test_description"]


def _f(x, digits: int = 3) -> str:
    """A number of this page's tables and sentences: three decimals unless told."""
    return fmt(x, digits)


# --------------------------------------------------------------------------- the paired tests' table
def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`synclib.analysis.power.paired_control_tests` for display, narrow enough for a book's text column.

    Indexed by the control and the kind of paired value (rows of one control together),
    numbers to three decimals, p-values as :func:`synclib.stats.format_p` writes them and
    the minimum detectable difference in the last column (of the corrected test for
    per-seed values, of the paired t-test for seed-averaged ones: :func:`_mde`).  t and the spread of the
    differences are left out to keep it narrow (the sentences of :func:`claims_text` give
    the spread)."""
    units = {"split_seed": "per split seed", "direction": "seeds averaged"}
    order = {c: i for i, c in enumerate(dict.fromkeys(table["control"]))}
    t = table.assign(_c=table["control"].map(order), _u=table["unit"].map({"split_seed": 0}).fillna(1))
    t = t.sort_values(["_c", "_u"], kind="stable")
    out = pd.DataFrame({
        "genuine vs": t["control"], "paired values": t["unit"].map(units).fillna(t["unit"]),
        "n": t["n_pairs"], "genuine": t["mean_genuine"].map(_f), "control": t["mean_control"].map(_f),
        "difference": t["mean_diff"].map(_f), "p (paired t)": t["p_t"].map(format_p),
        "p (re-splits)": t["p_corrected"].map(lambda p: format_p(p) if np.isfinite(p) else "—"),
        "p (episodes)": t["p_episodes"].map(lambda p: format_p(p) if np.isfinite(p) else "—"),
        "min. detectable difference": t.apply(_mde, axis=1).map(_f)})
    return out.set_index(["genuine vs", "paired values"])


# --------------------------------------------------------------------------- the tests the claims quote
def test_description(table: pd.DataFrame, surrogates: dict | None = None) -> str:
    """Markdown: the tests every claim's p comes from, in full, once (the claims' lines say "p = 0.004
    (test)" and link here).

    Parameters
    ----------
    table : DataFrame
        :func:`synclib.analysis.power.paired_control_tests` (per-split-seed values).
    surrogates : dict, optional
        :func:`synclib.analysis.power.surrogate_test` over all runs.
    """
    n = int(table["n_pairs"].max()) if len(table) else 0
    boot = table[table["n_boot"].astype(float) > 0] if len(table) else table
    m = int(boot["n_episodes"].max()) if len(boot) else 0
    if len(boot):
        controls = (f"**Genuine against a control** (the passive reader, the shuffled and lagged targets, the "
                    f"pseudo-dyads; figures 3-4): p is the larger of the corrected re-split t-test over {n} "
                    f"split-seed values and the bootstrap over {m} episodes. The first asks whether genuine "
                    "beats the control across re-splits of the same samples, corrected for their overlap (Nadeau "
                    "and Bengio); the second whether it does across the dialogs themselves, drawing whole episodes "
                    "with replacement with the maps held fixed. A claim counts a difference only where both find "
                    "it. The 95 % intervals of the claims and of the first page's scorecard are the bootstrap's "
                    "percentile intervals over the same episodes.")
    elif n:
        controls = (f"**Genuine against a control** (figures 3-4): p is the corrected re-split t-test's over {n} "
                    "split-seed values; this run's analyses have no resampled episodes, so there is no second test "
                    "and no interval.")
    else:
        controls = "**Genuine against a control** (figures 3-4): this run has no control to test."
    out = [controls]
    t = surrogates or {}
    if t.get("n_surrogates"):
        out.append(f"**Genuine against its surrogate partners** (figure 2): p is the larger of genuine's rank among "
                   f"its {t['n_surrogates']} surrogates (it cannot go below {fmt(1 / (1 + t['n_surrogates']), 3)}) "
                   f"and the bootstrap of the gap over {t.get('n_episodes') or m} episodes" +
                   (", whose percentile interval the claim quotes." if t.get("n_boot") else "."))
    out.append("**A setting against the original** (tables 2 and 5) and **a decoder against its baseline** "
               "(figure 11): p is the corrected re-split t-test's alone, over the paired values each line names; "
               "these analyses have no resampled episodes.")
    return "\n\n".join(out)


# --------------------------------------------------------------------------- the planted differences
def power_chart(curve: pd.DataFrame):
    """The power curve of :func:`synclib.analysis.power.planted_power`: the share of replicates in
    which the corrected test finds the planted difference (binomial SE bars), against the difference."""
    rate = pd.DataFrame({"planted": curve["planted"], "series": "corrected test, p < 0.05",
                         "mean": curve["rate"], "se": curve["rate_se"]})
    return lines_with_se(rate, x="planted", series="series", x_type="Q", y_title="share of replicates that find it",
                         x_title="planted genuine − control SyncR² (mean over the re-splits)",
                         title="Power of the claims' corrected test on this run's states")


def format_curve(curve: pd.DataFrame) -> pd.DataFrame:
    """:func:`synclib.analysis.power.planted_power` for display: one row per planted share."""
    return pd.DataFrame({
        "targets from a partner": curve["share"].map(lambda f: f"{100 * f:.3g} %"),
        "planted difference": curve["planted"].map(_f), "sd of the paired differences": curve["sd_diff"].map(_f),
        "found (p < 0.05)": [f"{int(d)} of {int(n)}" for d, n in zip(curve["detected"], curve["n_reps"])],
        "detectable (80 %, corrected test)": curve["mde"].map(_f)}).set_index("targets from a partner")


# --------------------------------------------------------------------------- the page's argument
def _pval(row) -> float:
    """The row's ``p`` (the larger of :data:`synclib.analysis.power.TWO_TESTS`) where it has one, else its paired t's."""
    return row["p"] if np.isfinite(row.get("p", math.nan)) else row["p_t"]


def _significant(row, level: float = 0.05) -> bool:
    p = _pval(row)
    return bool(np.isfinite(p) and p < level)


def _mde(row) -> float:
    """The minimum detectable difference of the test the claims use: the corrected resampled
    t-test's where the row has it, else the paired t-test's."""
    m = row.get("mde_corrected", math.nan)
    return float(m) if np.isfinite(m) else float(row["mde"])


def _can_detect(row, difference: float) -> bool:
    """Can the comparison ``row`` speak to a true ``difference`` (its minimum detectable
    difference is defined and no larger)?"""
    return bool(np.isfinite(_mde(row)) and _mde(row) <= difference)


def _row_sentence(row) -> str:
    what = row["control"]
    n, mde = int(row["n_pairs"]), _mde(row)
    if n < 2:
        return f"*Genuine vs {what}*: fewer than two paired values; nothing can be tested."
    head = (f"*Genuine vs {what}*: mean difference {_f(row['mean_diff'])} (sd {_f(row['sd_diff'])}, "
            f"{n} paired values), paired t {_p(row['p_t'])}, sign flips {_p(row['p_perm'])}")
    if np.isfinite(row.get("p", math.nan)):
        head += (f"; corrected for re-splits {_p(row['p_corrected'])}, bootstrap over {int(row['n_episodes'])} "
                 f"episodes {_p(row['p_episodes'])} (difference of the reported SyncR² {_f(row['sync_diff'])}, 95 % "
                 f"interval {interval_text(row)})")
    head += "."
    if _significant(row):
        word = "above" if row["mean_diff"] > 0 else "below"
        agree = ("" if np.isfinite(row["p_perm"]) and row["p_perm"] < 0.05
                 else " (the sign-flip test does not agree at 0.05)")
        by = " by the larger p of the corrected and the episode test" if np.isfinite(row.get("p", math.nan)) else ""
        return head + f" Genuine SyncR² is {word} {what}{by}{agree}."
    if np.isfinite(mde):
        return head + (f" Not significant: with {n} paired values this noisy, only a true difference above "
                       f"about {_f(mde)} is detected with 80 % power by the corrected test, so this is no evidence "
                       f"either way about a difference smaller than that.")
    return head + " The differences do not vary, so no test or detectable size is defined."


def claims_text(table: pd.DataFrame, curve: pd.DataFrame | None, sizes: dict, published: dict,
                paper_difference: float, paper_difference_source: str | None = None,
                conservative: pd.DataFrame | None = None) -> str:
    """Plain sentences on what the run can and cannot speak to, from the numbers.

    Parameters
    ----------
    table : DataFrame
        :func:`synclib.analysis.power.paired_control_tests` (per-split-seed pairs).
    curve : DataFrame or None
        :func:`synclib.analysis.power.planted_power` (None or empty: no planted differences).
    sizes : dict
        :func:`synclib.analysis.power.run_sample_sizes`.
    published : dict
        ``data/published.json`` (:func:`synclib.analysis.results.load_published`).
    paper_difference : float
        The genuine-passive SyncR² difference taken as the paper's.
    paper_difference_source : str, optional
        Where ``paper_difference`` comes from (default: a sentence saying the paper prints
        no number for it, so it is a stated assumption).
    conservative : DataFrame, optional
        :func:`synclib.analysis.power.paired_control_tests` with ``unit="direction"``.

    Returns
    -------
    str
        Markdown: one paragraph per point.
    """
    paras = []
    K, Ktr = sizes.get("n_samples", math.nan), sizes.get("n_train", math.nan)
    if len(table):
        paras.append(" ".join(_row_sentence(r) for _, r in table.iterrows()))
    else:
        paras.append("This run has no control condition to compare with the genuine one.")
    if conservative is not None and len(conservative):
        parts = [f"{r['control']} {_p(r['p_t'])}, detectable from about {_f(r['mde'])} ({int(r['n_pairs'])} values)"
                 for _, r in conservative.iterrows()]
        paras.append("The split seeds of a run re-split the same samples, so the per-seed values are not "
                     "independent: the plain paired t and sign-flip tests above overstate the evidence, which the "
                     "corrected test allows for. Another way round it averages the split seeds first (one value per "
                     "ordered run and direction) and runs the plain paired t-test on those few values: "
                     + "; ".join(parts) + ". It is not the claims' test, and it is not more conservative: averaging "
                     "the seeds also removes their noise, so its detectable difference can be the smaller one.")

    src = paper_difference_source or (
        "The paper prints no number for the genuine-passive difference (figure 4a is a bar chart "
        "without printed values, and data/published.json holds only the claim), so this page takes "
        f"{_f(paper_difference, 2)} SyncR² as the paper's difference: a stated assumption, not a published number.")
    claim = published.get("fig3_4", {})
    pas = table[table["control"] == "passive"] if len(table) else table
    if len(pas):
        r = pas.iloc[0]
        need = n_pairs_needed(paper_difference, r["sd_diff"])
        can = _can_detect(r, paper_difference)
        s = (f"Paper claim (section 4.2): \"{claim.get('claim_passive', 'passive SyncR² is below genuine')}\" "
             f"{src} With {int(r['n_pairs'])} paired values whose differences have sd {_f(r['sd_diff'])}, this run ")
        if can:
            s += (f"**can** speak to a difference of that size (it detects differences above about {_f(_mde(r))} "
                  f"with 80 % power)")
            s += (", and it finds genuine above passive." if _significant(r) and r["mean_diff"] > 0 else
                  f", yet it does not find genuine above passive ({_p(_pval(r))}): evidence against a difference "
                  f"of the paper's size in this run.")
        else:
            s += (f"**cannot** speak to a difference of that size: it detects only differences above about "
                  f"{_f(_mde(r))} with 80 % power.")
        if need:
            s += f" At this sd, a difference of {_f(paper_difference, 2)} needs about {need} paired values."
        paras.append(s)
    else:
        paras.append(f"Paper claim (section 4.2) on the passive reader: this run has no passive condition, so it "
                     f"cannot speak to it. {src}")

    lags = table[table["control"].str.startswith("lag")] if len(table) else table
    if len(lags):
        s = f"Paper claim (section 4.2): \"{claim.get('claim_lag', 'synchrony collapses at lag k >= 1')}\" "
        parts = []
        for _, r in lags.iterrows():
            if _significant(r) and r["mean_diff"] > 0:
                parts.append(f"{r['control']}: genuine is above it ({_p(_pval(r))})")
            else:
                parts.append(f"{r['control']}: not detected ({_p(_pval(r))}; detectable from about {_f(_mde(r))})")
        paras.append(s + "In this run, " + "; ".join(parts) + ".")

    if curve is not None and len(curve):
        paras.append(_curve_sentence(curve, pas.iloc[0] if len(pas) else None, paper_difference))

    f9 = published.get("fig9", {})
    if f9.get("n_samples") and np.isfinite(K):
        paras.append(f"Paper claim (appendix D): \"{f9.get('claim', '')}\" The paper uses {f9['n_samples']:,} samples "
                     f"per dataset; this run has about {K:.0f} ({Ktr:.0f} for training), so it cannot speak to what "
                     f"happens near {f9['n_samples']:,}.")
    return "\n\n".join(paras)


def _curve_sentence(curve: pd.DataFrame, passive_row, paper_difference: float) -> str:
    """The planted differences' paragraph of :func:`claims_text`, from
    :func:`synclib.analysis.power.planted_power`."""
    c = curve.sort_values("planted").reset_index(drop=True)
    if not (c["planted"] > 0).any():
        return ("Planted differences: none could be planted. Genuine's SyncR² on the fitted layers is 0 (or "
                "could not be fitted) in every re-split, so a control that takes some of its targets from a "
                "surrogate partner cannot fall below it; the curve needs a run whose SyncR² leaves 0.")
    first, last = c.iloc[0], c.iloc[-1]
    layers = curve.attrs.get("layers", {})
    n_layers = sorted({len(v.split()) for pair in layers.values() for v in pair if v})
    depth = f"{'-'.join(map(str, n_layers))} evenly spaced layers of each model" if n_layers else "a subset of layers"
    s = (f"Planted differences: in this run's own states, a control that takes a share of genuine's target rows "
         f"from a surrogate partner ({100 * c['share'].min():.3g} % to {100 * c['share'].max():.3g} %) is fitted "
         f"beside genuine on the same rows at genuine's penalties, on {depth}, in {int(first['n_reps'])} "
         f"replicates, each re-splitting every ordered run at fresh split seeds ({int(first['n_pairs'])} paired "
         f"values each, the corrected test as the claims use it). A planted difference of {_f(first['planted'])} is found at p < 0.05 in "
         f"{int(first['detected'])} of {int(first['n_reps'])} replicates, one of {_f(last['planted'])} in "
         f"{int(last['detected'])} of {int(last['n_reps'])}")
    m = detection_size(c, by="planted")
    if m is None:
        s += f"; even {_f(last['planted'])} is found less than 80 % of the time."
    else:
        at = c[c["planted"] == m].iloc[0]
        s += (f"; from about **{_f(m)}** on it is found at least 80 % of the time (the corrected test's own "
              f"formula, at the spread of those paired differences, puts its 80 % point at {_f(at['mde'])}).")
    if np.isfinite(paper_difference) and paper_difference <= float(last["planted"]):
        near = c.iloc[int(np.argmin(np.abs(c["planted"].to_numpy(float) - paper_difference)))]
        s += (f" Nearest the difference taken as the paper's ({_f(paper_difference, 2)}): {_f(near['planted'])}, "
              f"found in {int(near['detected'])} of {int(near['n_reps'])}.")
    if passive_row is not None and np.isfinite(passive_row["sd_diff"]):
        s += (f" The planted comparisons' paired differences have sd {_f(float(c['sd_diff'].median()))} (median over "
              f"shares), this run's genuine-passive ones {_f(passive_row['sd_diff'])}.")
    s += (" The re-splits keep this run's samples, so the curve shows how the test behaves on this run's data, "
          "not the spread between new runs of dialogs; and a claim also needs the episode bootstrap, so its chance "
          "of finding a difference is at most the curve's. The planted differences are measured on the layers "
          "fitted, not on every layer as the reported SyncR².")
    return s
