"""Figure 6 and table 1: SyncR² against social performance, also given ability (section 5).

The notebook ``notebooks/fig06_table1_social.md`` draws this page from the functions here:
figure 6's chart of :meth:`synclib.analysis.results.Results.pair_table` (:func:`sync_vs_social`), the
judged dialogs (:meth:`~synclib.analysis.results.Results.judged_table`, :func:`sentence_judged`), the
correlations per family (:func:`correlations_by_group`, :func:`published_correlations`,
:func:`sentence_fig6`), table 1 (:func:`load_ability_scores`, :func:`ability_table`,
:func:`partial_table`, :func:`sentence_table1`), the tables as a page shows them
(:func:`readable`, shared) and the claims (:func:`social`).
"""
from __future__ import annotations

import os

import altair as alt
import numpy as np
import pandas as pd

from synclib import stats
from synclib.analysis.results import ResultsError
from synclib.figures.charts import colour_scale, need_columns, placeholder_if_empty, with_bounds
from synclib.figures.report import paper_note, readable
from synclib.figures.verdicts import AGREES, CANNOT, DIFFERS, Claim, pairs_text, significant
from synclib.paths import display, in_repo
from synclib.stats import correlations_by_group
from synclib.stats import fmt as _f

__all__ = ["load_ability_scores", "ability_table", "partial_table", "published_correlations", "correlations_by_group",
           "readable", "sync_vs_social", "sentence_judged", "sentence_fig6", "sentence_table1", "social", "CLAIMS"]


# --------------------------------------------------------------------------- tables
def load_ability_scores(path: str | os.PathLike) -> pd.DataFrame:
    """Read a CSV of per-model ability scores for table 1.

    Columns (case-insensitive): ``model`` (a model label or spec as in the manifest),
    ``ifeval``, ``musr``; any other column (e.g. ``source``) is kept.
    """
    path = in_repo(path)
    if not path.is_file():
        raise ResultsError(f"ability_scores: file not found: {display(path)}")
    df = pd.read_csv(path)
    df.columns = [c.strip().lower() for c in df.columns]
    missing = [c for c in ("model", "ifeval", "musr") if c not in df.columns]
    if missing:
        raise ResultsError(f"{path}: missing column(s) {missing}; have {list(df.columns)}")
    for c in ("ifeval", "musr"):
        bad = pd.to_numeric(df[c], errors="coerce").isna() & df[c].notna()
        if bad.any():
            raise ResultsError(f"{path}: column {c!r} has non-numeric value(s) "
                               f"{df.loc[bad, c].tolist()}")
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def ability_table(res, scores: pd.DataFrame) -> pd.DataFrame:
    """Table 1's data as the reference's ``compute_partial_correlation`` takes it: per
    unordered pair, the social performance of the order-1 run, the mean of the A->B
    SyncR² of both runs (agent 1 -> agent 2 in each order), and ``ifeval``, ``musr``
    (mean of the two models; matched by manifest label, then spec).  ``res``: a
    :class:`synclib.analysis.results.Results`; ``scores``: :func:`load_ability_scores`."""
    rows = []
    for _, runs in res.units():
        rows.append({**res.unit_info(runs), "social": res.run_social(runs[0].name),
                     "sync": res.unit_value(runs, directions=["A->B"], condition="genuine")["mean"]})
    t = pd.DataFrame(rows)
    lookup = scores.set_index("model")
    keyed = t.copy()
    for side in ("a", "b"):
        specs = {p: getattr(res.runs_of(p)[0], f"spec_{side}") for p in res.pair_names}
        keyed[f"model_{side}"] = [m if m in lookup.index else (specs.get(n) or m)
                                  for n, m in zip(t["pair"], t[f"model_{side}"])]
    withab = stats.pair_ability(keyed, scores)
    t["ifeval"] = withab["ifeval"].to_numpy()
    t["musr"] = withab["musr"].to_numpy()
    return t


def partial_table(pairs: pd.DataFrame, by: str = "family",
                  measures=("ifeval", "musr"), pooled: str = "All pairs") -> pd.DataFrame:
    """Table 1: partial r of SyncR² and social performance given each measure, per group."""
    rows = []
    groups = list(pairs.groupby(by, sort=False)) + [(pooled, pairs)]
    for name, sub in groups:
        row = {"family": name, "n": int(sub[["sync", "social"]].dropna().shape[0])}
        for m in measures:
            c = stats.partial_pearson(sub, "sync", "social", m)
            row[m] = c.r
            row[f"{m} p"] = c.p
            row[f"{m} note"] = c.describe()
        rows.append(row)
    return pd.DataFrame(rows)


def published_correlations(published: dict) -> pd.DataFrame:
    """Figure 6's published Pearson r per family as a table."""
    return pd.DataFrame(published["fig6"]["pearson"]).rename(columns={"r": "paper r",
                                                                      "p": "paper p"})


# --------------------------------------------------------------------------- chart
@placeholder_if_empty
def sync_vs_social(frame: pd.DataFrame, title: str) -> alt.LayerChart:
    """SyncR² (y) against social performance (x), one point per pair, coloured by family.

    ``frame`` columns: ``pair, family, social, sync, sync_se, fit``; a least-squares line
    is drawn per family only for rows with ``fit`` true (families with at least 3 pairs).
    """
    need_columns(frame, ["pair", "family", "social", "sync", "sync_se", "fit"], "sync_vs_social")
    d = with_bounds(frame, mean="sync", se="sync_se")
    tips = [alt.Tooltip("pair:N"), alt.Tooltip("family:N"),
            alt.Tooltip("social:Q", title="social performance", format=".3f"),
            alt.Tooltip("sync:Q", title="SyncR²", format=".3f"),
            alt.Tooltip("sync_se:Q", title="SE", format=".3f")]
    xs = alt.X("social:Q", title="social performance (judge, mean of 7 dimensions)",
               scale=alt.Scale(zero=False))
    color = alt.Color("family:N", title="family", scale=colour_scale(d["family"]))
    pts = alt.Chart().mark_circle(size=90).encode(x=xs, y=alt.Y("sync:Q", title="SyncR²"),
                                                  color=color, tooltip=tips)
    err = alt.Chart().mark_errorbar().encode(x=xs, y=alt.Y("lo:Q", title="SyncR²"), y2="hi:Q",
                                             color=color)
    labels = alt.Chart().mark_text(dx=8, align="left").encode(x=xs, y="sync:Q", text="pair:N")
    layers = [pts, err, labels]
    if bool(d["fit"].any()):
        layers.append(alt.Chart().transform_filter(alt.datum.fit).transform_regression(
            "social", "sync", groupby=["family"]).mark_line(strokeDash=[4, 3]).encode(
            x="social:Q", y="sync:Q", color=color))
    return alt.layer(*layers, data=d).properties(title=title, width=420, height=300)


# --------------------------------------------------------------------------- sentences
def sentence_judged(table: pd.DataFrame, scores: pd.DataFrame | None = None) -> str:
    """How many dialogs of each ordered run were judged, what that says about its mean and, with
    the per-dialog ``scores`` (:meth:`synclib.analysis.results.Results.dialog_scores`), whether the runs
    differ (:func:`synclib.stats.compare_groups`): no ranking without a test."""
    if table.empty:
        return "This run has no judge scores."
    parts = [f"{r['run']}: {r['judged']} of {r['dialogs'] if np.isfinite(r['dialogs']) else '?'} dialogs, "
             f"{_f(r['mean'])} (95 % interval {_f(r['lo'])} to {_f(r['hi'])})" for _, r in table.iterrows()]
    s = ("Social performance per ordered run, over its judged dialogs: " + "; ".join(parts) + ". A run "
         "judged on a random sample estimates its mean over all its dialogs within that interval.")
    if scores is not None and scores["run"].nunique() > 1:
        test = stats.compare_groups(scores, "score", "run")
        s += (f" Do the runs differ? {test['name']} over the judged dialogs: {stats.p_clause(test['p'])}; "
              + ("the runs' social performance differs." if test["p"] < 0.05 else
                 "no run is rated differently from the others at this sample size, so the runs are not ranked."))
    return s


def sentence_fig6(pairs: pd.DataFrame, cors: pd.DataFrame, published: dict) -> str:
    """Per-family and pooled correlation of SyncR² with social performance."""
    n_social = int(pairs["social"].notna().sum())
    if n_social == 0:
        s = ("No pair has judge scores in this run, so SyncR² cannot be set against social "
             "performance.")
    else:
        parts = [f"{r.group}: {r.text}" for r in cors.itertuples()]
        s = (f"Pearson correlation of SyncR² with social performance over {n_social} pairs - "
             f"{'; '.join(parts)}.")
    pub = "; ".join(f"{d['family']} r = {d['r']} (p {d['p']})" for d in published["fig6"]["pearson"])
    return s + paper_note(published["fig6"], pub + ".")


def sentence_table1(table: pd.DataFrame | None, ability_scores, published: dict,
                    abilities: pd.DataFrame | None = None) -> str:
    """Table 1, or a plain statement of what is missing: no ability CSV, or no scores in it
    for this run's models (``abilities``: :func:`ability_table`)."""
    p = published["table1"]
    pub = "; ".join(f"{d['family']} {d['ifeval']} / {d['musr']}" for d in p["partial_r"])
    pub = f"partial r given IFEval / MuSR: {pub}. {p['note']}"
    if table is None:
        return (f"No ability scores were given (`ability_scores = {ability_scores!r}`), so the "
                "partial correlations of table 1 are not computed here; pass a CSV with columns "
                "`model,ifeval,musr` to compute them." + paper_note(p, pub))
    if abilities is not None and abilities[["ifeval", "musr"]].isna().all(axis=None):
        models = sorted(set(abilities["model_a"]) | set(abilities["model_b"]))
        return (f"`{ability_scores}` has no IFEval or MuSR scores for this run's models "
                f"({', '.join(models)}), so table 1 cannot be computed here; the shipped CSV holds "
                "the scores the paper's code used for its six models. Pass a CSV with columns "
                "`model,ifeval,musr` naming these models to compute it." + paper_note(p, pub))
    parts = [f"{r['family']}: IFEval {r['ifeval note']}, MuSR {r['musr note']}"
             for _, r in table.iterrows()]
    return ("Partial correlation of SyncR² with social performance given ability, per model pair "
            "as the paper's code computes it (the first speaking order's social performance, the "
            "agent 1 -> agent 2 SyncR² of both orders) - " + "; ".join(parts) + "." + paper_note(p, pub))


# --------------------------------------------------------------------------- claims
def social(res, published: dict) -> Claim:
    """Figure 6 and table 1: SyncR² tracks social performance (also given ability)."""
    what = "SyncR² tracks social performance, also given IFEval and MuSR (section 5, figure 6, table 1)"
    enough, text = pairs_text(res)
    if not enough:
        return Claim("fig6", what, CANNOT, text + ".")
    t = res.pair_table()
    c = stats.pearson(t["sync"], t["social"])
    text += f"; SyncR² against the judged social score over the pairs: {c.describe()}"
    if not c.ok:
        return Claim("fig6", what, CANNOT, text + ".")
    return Claim("fig6", what, AGREES if c.r > 0 and significant(c.p) else DIFFERS, text + "; the partial correlations "
                 "given ability are on the table 1 page.")


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((social, "fig6"), (social, "table1"),)
