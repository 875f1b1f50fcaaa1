"""Figure 5: SyncR² by relationship closeness (section 4.3, appendix G).

The notebook ``notebooks/fig05_relationship.md`` draws this page from the functions here: the
chart of :meth:`synclib.analysis.results.Results.relationship_table` (:func:`distribution_by_category`),
the test of closeness (:func:`relationship_closeness`), the sentence beside the paper's claim
(:func:`sentence_relationship`) and the claim (:func:`relationships`).
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from synclib import stats
from synclib.figures.charts import WRAPPED_LABEL, colour_scale, need_columns, placeholder_if_empty
from synclib.figures.report import empty_note, join_words, paper_note
from synclib.figures.verdicts import AGREES, CANNOT, DIFFERS, Claim, Measure, significant
from synclib.stats import MIN_N_CORR
from synclib.stats import fmt as _f
from synclib.tasks.scenarios import CLOSENESS_CODES, RELATIONSHIPS

__all__ = ["relationship_closeness", "closeness_within_pairs", "distribution_by_category", "sentence_relationship", "relationships", "CLAIMS"]


# --------------------------------------------------------------------------- test
def _pair_means(res, table: pd.DataFrame | None) -> pd.DataFrame:
    """Each category's mean SyncR² per model pair (code x pair), over the paper's five codes."""
    t = res.relationship_table() if table is None else table
    t = t[t["code"].isin(CLOSENESS_CODES)]
    return t.groupby(["code", "pair"])["sync"].mean().unstack("pair")


def relationship_closeness(res, table: pd.DataFrame | None = None) -> stats.Correlation:
    """Figure 5's test: Pearson r of closeness (the paper's five codes,
    :data:`synclib.tasks.scenarios.CLOSENESS_CODES`) with each category's SyncR² over
    :meth:`synclib.analysis.results.Results.relationship_table` (``table``; None: ``res``'s), one point
    per category (its subsets share its scenarios, so the category is the unit).  Only the
    categories every model pair has count, each the mean of its per-pair means, so that no
    category's mean comes from other pairs than another's (pairs differ in SyncR² far more than
    categories do).  ``family_member`` stays out: the paper never places it."""
    per = _pair_means(res, table).dropna()
    means = per.mean(axis=1)
    return stats.pearson(means.index.to_numpy(float), means.to_numpy(float))


def closeness_within_pairs(res, table: pd.DataFrame | None = None) -> dict:
    """Pearson r of closeness with the category means within each model pair: pair -> Correlation."""
    per = _pair_means(res, table)
    return {pair: stats.pearson(col.dropna().index.to_numpy(float), col.dropna().to_numpy(float))
            for pair, col in per.items()}


# --------------------------------------------------------------------------- chart
@placeholder_if_empty
def distribution_by_category(frame: pd.DataFrame, category: str, value: str, title: str,
                             order_by: str | None = None, color: str | None = None,
                             y_title: str = "SyncR²") -> alt.LayerChart:
    """Box plots of ``value`` per ``category`` with every sample as a hoverable point.

    ``order_by`` names a numeric column that orders the categories (e.g. the relationship
    code, from strangers to family).
    """
    need_columns(frame, [category, value] + ([color] if color else []) + ([order_by] if order_by else []),
          "distribution_by_category")
    order = (list(frame.sort_values(order_by)[category].drop_duplicates()) if order_by
             else None)
    xs = alt.X(f"{category}:N", sort=order, title=category, axis=alt.Axis(labelAngle=0, labelExpr=WRAPPED_LABEL))
    box = alt.Chart().mark_boxplot(extent="min-max", opacity=0.5).encode(
        x=xs, y=alt.Y(f"{value}:Q", title=y_title))
    tips = [alt.Tooltip(f"{c}:N") for c in frame.columns if frame[c].dtype == object]
    tips.append(alt.Tooltip(f"{value}:Q", format=".3f"))
    pts = alt.Chart().mark_circle(size=30, opacity=0.8).encode(
        x=xs, y=f"{value}:Q", xOffset=alt.XOffset(f"{color}:N") if color else alt.Undefined,
        color=alt.Color(f"{color}:N", scale=colour_scale(frame[color])) if color else alt.value("black"), tooltip=tips)
    return alt.layer(box, pts, data=frame).properties(title=title, width=420)


# --------------------------------------------------------------------------- sentence
def sentence_relationship(table: pd.DataFrame, published: dict, res=None) -> str:
    """Mean SyncR² per relationship, the test of closeness over the paper's five categories
    (:func:`relationship_closeness`), how family_member is treated,
    and how many scenarios each category comes from."""
    p = published["fig5"]
    if table.empty:
        return empty_note("relationship analysis", "relationship_sync_r2", table) + paper_note(p, p["claim"])
    means = table.groupby(["code", "relationship"])["sync"].agg(["mean", "count"]).reset_index()
    means = means.sort_values("code")
    parts = [f"{r.relationship} {_f(r['mean'])} (n = {r['count']})" for _, r in means.iterrows()]
    s = f"Mean SyncR² by relationship: {join_words(parts)}."
    if res is not None:
        c = relationship_closeness(res, table)
        s += (f" Over the paper's five categories (appendix G names {', '.join(RELATIONSHIPS[k] for k in CLOSENESS_CODES)},"
              f" codes {CLOSENESS_CODES[0]}-{CLOSENESS_CODES[-1]}), closeness and the categories' SyncR² correlate "
              f"with {c.describe()}, one point per category that every model pair has (its mean over the pairs' "
              f"means){_within_text(res, table)}.")
    outside = sorted(set(table.loc[~table["code"].isin(CLOSENESS_CODES), "relationship"]))
    if outside:
        s += (f" {join_words(outside)} (Sotopia's code {', '.join(str(k) for k in RELATIONSHIPS if RELATIONSHIPS[k] in outside)}) "
              "is not among them: none of the paper's 450 tasks uses it and the paper never places it on its "
              "closeness scale, so it is drawn last and left out of the correlation.")
    if res is not None and (absent := sorted(set(res.relationship_scenarios(with_values=False)) - set(table["relationship"]))):
        s += (f" {join_words(absent)} {'is' if len(absent) == 1 else 'are'} in this run's tasks but left out: too few of "
              "its test samples in every split.")
    if res is not None and (scen := res.relationship_scenarios()):
        s += (" Scenarios per category in this run's tasks: " + ", ".join(f"{k} {v}" for k, v in scen.items())
              + (". Where a category comes from one or two scenarios, relationship cannot be told apart from the "
                 "scenario itself." if min(scen.values()) < 3 else "."))
    if "n_test" in table and np.isfinite(table["n_test"]).any():
        per = table.groupby("pair")["n_test"].first()
        s += (f" Each value is SyncR² on a test subset of {join_words([f'{v:.0f} ({k})' for k, v in per.items()])} "
              "samples per relationship (every relationship subsampled to the smallest one's count; n counts "
              "split seeds x subsamples x runs, which re-use the same dialogs).")
    return s + paper_note(p, p["claim"])


def _within_text(res, table=None) -> str:
    """``"; within each pair: S-S r = -0.26 (n = 4), G-G ..."``."""
    within = closeness_within_pairs(res, table)
    if len(within) < 2:
        return ""
    return "; within each pair: " + ", ".join(f"{k} {c.describe()}" for k, c in within.items())


# --------------------------------------------------------------------------- claim
def relationships(res, published: dict) -> Claim:
    """Figure 5: SyncR² rises with closeness (appendix G)."""
    what = "SyncR² rises with relationship closeness (section 4.3, figure 5)"
    t = res.relationship_table()
    if t.empty:
        return Claim("fig5", what, CANNOT, "no category has a SyncR² in this run (too few samples to fit the maps)."
                     if t.attrs.get("present") else "this run has no relationship analysis.")
    c = relationship_closeness(res, t)
    five = {RELATIONSHIPS[k] for k in CLOSENESS_CODES}
    every = res.relationship_scenarios()
    scen = {k: v for k, v in every.items() if k in five}       # the categories in the correlation
    others = {k: v for k, v in every.items() if k not in five}
    few = {k: v for k, v in scen.items() if v < 3}
    text = (f"{c.describe()} between closeness (the paper's five codes, strangers 0 to romantic 4) and the "
            f"categories' SyncR², over the {c.n} of them every model pair has, each the mean of the pairs' means "
            f"(the unit: a category's test subsets share its scenarios){_within_text(res, t)}")
    if scen:
        text += "; scenarios per category: " + ", ".join(f"{k} {v}" for k, v in scen.items())
    if others:
        text += " (outside the five codes, not in the correlation: " + ", ".join(f"{k} {v}" for k, v in others.items()) + ")"
    m = (Measure(f"Pearson r over {c.n} categories", c.r, p=c.p, digits=2),) if c.ok else ()
    if few:
        return Claim("fig5", what, CANNOT, text + (
            f". Relationship is confounded with scenario: {', '.join(few)} come from fewer than 3 scenarios each."), m)
    if c.n < MIN_N_CORR + 2:
        return Claim("fig5", what, CANNOT, text + f". {c.n} categories are too few for a correlation.", m)
    if c.ok and c.r > 0 and significant(c.p):
        return Claim("fig5", what, AGREES, text + ".", m)
    return Claim("fig5", what, DIFFERS, text + ": no positive correlation at (Holm-adjusted) p < 0.05.", m)


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((relationships, "fig5"),)
