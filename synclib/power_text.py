"""The power page's text: the paired tests' tables for display and the generated argument.

* :func:`format_table`, :func:`format_by_run`: :func:`synclib.power.paired_control_tests`
  and :func:`synclib.power.paired_tests_by_run` as narrow display tables;
  :func:`by_run_sentence`: one sentence per ordered run.
* :func:`claims_text`: the power page's argument, generated from those numbers and the
  :func:`synclib.recovery.recovery_curve`, on what the controls' comparisons can and cannot
  show (:mod:`synclib.claims` gives every claim of the paper its line);
  :func:`why_untestable`: why a comparison allows no test.
* :data:`ASSUMED_PAPER_DIFFERENCE`: the genuine-passive difference taken as the paper's.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from synclib.power import TWO_TESTS, n_pairs_needed, reported_difference, significantly_above
from synclib.recovery import detection_size

__all__ = [
    "ASSUMED_PAPER_DIFFERENCE",
    "by_run_sentence",
    "claims_text",
    "format_by_run",
    "format_table",
    "why_untestable",
]


# --------------------------------------------------------------------------- tables
def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`synclib.power.paired_control_tests` for display, narrow enough for a book's text column.

    Indexed by the control and the kind of paired value (rows of one control together),
    numbers to three decimals, p-values as :func:`synclib.stats.format_p` writes them and
    the minimum detectable difference in the last column (of the corrected test for
    per-seed values, of the paired t-test for seed-averaged ones: :func:`_mde`).  t and the spread of the
    differences are left out to keep it narrow (the sentences of :func:`claims_text` give
    the spread)."""
    from synclib.stats import format_p

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


def format_by_run(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`synclib.power.paired_tests_by_run` for display: one row per run and control, the reported
    SyncR² (reference aggregation, directions averaged) and both tests (:data:`synclib.power.TWO_TESTS`)."""
    from synclib.stats import format_p

    def fp(p):
        return format_p(p) if np.isfinite(p) else "—"

    boot = table["sync_diff"].notna()
    out = pd.DataFrame({
        "run": table["run"], "genuine vs": table["control"],
        "genuine": table["sync_genuine"].where(boot, table["mean_genuine"]).map(_f),
        "control": table["sync_control"].where(boot, table["mean_control"]).map(_f),
        "difference": table.apply(reported_difference, axis=1).map(_f),
        "95 % interval (episodes)": table.apply(_interval, axis=1),
        "p (re-splits)": table["p_corrected"].map(fp), "p (episodes)": table["p_episodes"].map(fp),
        "min. detectable difference": table["mde_corrected"].map(_f)})
    return out.set_index(["run", "genuine vs"])


def _interval(row) -> str:
    return (f"{_f(row['ci_lo'])} to {_f(row['ci_hi'])}" if np.isfinite(row.get("ci_lo", math.nan)) else "—")


def by_run_sentence(table: pd.DataFrame, embedded: bool) -> str:
    """One sentence per ordered run of :func:`synclib.power.paired_tests_by_run`: which controls its
    genuine SyncR² is significantly above (p < 0.05 by the larger p of the two tests,
    :data:`synclib.power.TWO_TESTS`), and which not."""
    who = "the embedded models show" if embedded else "this run shows"
    out = []
    for run, t in table.groupby("run", sort=False):
        if run == "all runs":
            continue
        above = [f"{r['control']} (by {_f(reported_difference(r))}, {_p(r['p'])})" for _, r in t.iterrows()
                 if significantly_above(r)]
        rest = [f"{r['control']} ({_p(r['p'])})" for _, r in t.iterrows() if not significantly_above(r)]
        first = t.iloc[0] if len(t) else None
        g = (first["sync_genuine"] if first is not None and np.isfinite(first["sync_genuine"])
             else first["mean_genuine"] if first is not None else math.nan)
        s = f"In {run}, {who} genuine SyncR² {_f(g)}"
        s += (f", significantly above {', '.join(above)}" if above else ", above no control significantly")
        s += (f"; not significantly above {', '.join(rest)}." if rest else ".")
        out.append(s)
    return " ".join(out) + (f" Each p is the larger of two tests: {TWO_TESTS.split(';')[0]}." if out else "")


# --------------------------------------------------------------------------- sentences
def _f(x, digits: int = 3) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def _p(p) -> str:
    """``"p = 0.012"`` or ``"p < 0.001"``."""
    from synclib.stats import p_clause

    return p_clause(p)


def _pval(row) -> float:
    """The row's ``p`` (the larger of :data:`synclib.power.TWO_TESTS`) where it has one, else its paired t's."""
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


def why_untestable(row) -> str | None:
    """Why the comparison ``row`` allows no test, in a clause for the first page; None if it does."""
    n = int(row["n_pairs"])
    if n < 2:
        return f"{n} paired value(s), too few for a test"
    if not np.isfinite(row["mde"]):
        same = (f"are equal in all {n} paired values (both {_f(row['mean_genuine'])})" if row["mean_diff"] == 0
                else f"differ by the same {_f(row['mean_diff'])} in all {n} paired values")
        return f"genuine and {row['control']} {same}, so no test or detectable size is defined"
    return None


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
                 f"interval {_interval(row)})")
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
        :func:`synclib.power.paired_control_tests` (per-split-seed pairs).
    curve : DataFrame or None
        :func:`synclib.recovery.power_curve` at this run's size (None: no simulation).
    sizes : dict
        :func:`synclib.power.run_sample_sizes`.
    published : dict
        ``data/published.json`` (:func:`synclib.results.load_published`).
    paper_difference : float
        The genuine-passive SyncR² difference taken as the paper's.
    paper_difference_source : str, optional
        Where ``paper_difference`` comes from (default: a sentence saying the paper prints
        no number for it, so it is a stated assumption).
    conservative : DataFrame, optional
        :func:`synclib.power.paired_control_tests` with ``unit="direction"``.

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
                     "independent and the tests above overstate the evidence. With the split seeds averaged "
                     "first (one value per ordered run and direction): " + "; ".join(parts) + ".")

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
        paras.append(_curve_sentence(curve, sizes, pas.iloc[0] if len(pas) else None, paper_difference))

    f9 = published.get("fig9", {})
    if f9.get("n_samples") and np.isfinite(K):
        paras.append(f"Paper claim (appendix D): \"{f9.get('claim', '')}\" The paper uses {f9['n_samples']:,} samples "
                     f"per dataset; this run has about {K:.0f} ({Ktr:.0f} for training), so it cannot speak to what "
                     f"happens near {f9['n_samples']:,}.")
    return "\n\n".join(paras)


#: The genuine-passive SyncR² difference taken as the paper's where a run is judged against
#: it.  The paper prints no number for it (figure 4a is a bar chart without values): a stated
#: assumption, said so wherever it is used.
ASSUMED_PAPER_DIFFERENCE = 0.1


def _curve_sentence(curve: pd.DataFrame, sizes: dict, passive_row, paper_difference: float) -> str:
    """The simulation's paragraph of :func:`claims_text`: a :func:`synclib.recovery.power_curve`
    at this run's size."""
    c = curve.sort_values("planted").reset_index(drop=True)
    st = curve.attrs.get("setting", {})
    K, Ktr = sizes.get("n_samples", math.nan), sizes.get("n_train", math.nan)
    n_runs, run_runs = st.get("n_runs", "?"), sizes.get("n_runs")
    capped = (f" (capped from this run's {run_runs})" if isinstance(n_runs, int) and run_runs and run_runs > n_runs
              else "")
    test = {"corrected": "the corrected resampled t-test, as the claims", "t": "the paired t-test",
            "perm": "the sign-flip test"}.get(st.get("test", "corrected"), st.get("test", "?"))
    first, last = c.iloc[0], c.iloc[-1]
    s = (f"Simulation: on synthetic cubes ({st.get('layers', '?')} layers of width {st.get('dim', '?')}) of "
         f"{int(first['n_samples'])} samples per dataset, analysed as this run is ({n_runs} ordered runs{capped} x 2 "
         f"directions x {len(st.get('split_seeds', []))} split seeds = {int(first['n_pairs'])} paired values, ridge "
         f"penalty {st.get('ridge_alpha', '?')}, {test}), a planted genuine-passive difference (as measured with "
         f"{st.get('calibration_samples', 'many')} samples per dataset) is recovered at p < 0.05 in "
         f"{int(first['detected'])} of {int(first['n_reps'])} replicates at {_f(first['planted'], 3)} and "
         f"{int(last['detected'])} of {int(last['n_reps'])} at {_f(last['planted'], 3)}")
    m = detection_size(c, by="planted")
    if m is None:
        s += f"; even {_f(last['planted'], 3)} is recovered less than 80 % of the time."
    else:
        s += f"; from about **{_f(m, 3)}** on it is recovered at least 80 % of the time."
    near = c.iloc[int(np.argmin(np.abs(c["planted"].to_numpy(float) - paper_difference)))]
    if np.isfinite(paper_difference) and abs(near["planted"] - paper_difference) <= 0.02:
        s += (f" Near the difference taken as the paper's ({_f(paper_difference, 2)}) it is recovered in "
              f"{int(near['detected'])} of {int(near['n_reps'])}.")
    if np.isfinite(K):
        s += f" This run has about {K:.0f} samples per dataset ({Ktr:.0f} for training)"
        if passive_row is not None and np.isfinite(passive_row["sd_diff"]):
            s += (f"; the simulated paired differences have sd {_f(float(c['mean_sd_diff'].median()))}, this run's "
                  f"genuine-passive ones {_f(passive_row['sd_diff'])}")
        s += "."
    dims = sizes.get("dims") or []
    s += (" The synthetic states are tiny"
          + (f" (width {st.get('dim', '?')}, against {', '.join(map(str, dims))} in this run)" if dims else "")
          + ": a ridge map over wider states needs more samples, so for the real models these differences are a "
          "lower bound, and the synthetic noise is not the models' noise.")
    return s
