"""Figure 7: SyncR² with the top-k target layers and its correlation with social performance (appendix C.1).

The notebook ``notebooks/fig07_topk.md`` draws this page from the functions here: the table
(:func:`topk_table`) and its correlations with social performance (:func:`topk_correlations`),
their charts (:func:`lines_with_se`, shared; :func:`correlation_vs_k`), the sentence beside the
paper's claim (:func:`sentence_topk`) and the claim (:func:`topk`).
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from synclib import stats
from synclib.figures.charts import colour_scale, need_columns, placeholder_if_empty, lines_with_se, placeholder
from synclib.figures.report import empty_note, paper_note
from synclib.figures.verdicts import AGREES, CANNOT, DIFFERS, Claim, pairs_text
from synclib.stats import fmt as _f

__all__ = ["topk_table", "topk_correlations", "lines_with_se", "correlation_vs_k", "sentence_topk", "topk", "CLAIMS"]


# --------------------------------------------------------------------------- tables
def topk_table(res) -> pd.DataFrame:
    """Figure 7: per pair and k, SyncR² with the top-k target layers (clipped, as the
    reference; protocol correction 15), for every k that all the pair's directional values
    have (up to the shallower target model's depth).  ``target_layers``: the depths of the
    pair's target models, e.g. ``"30"`` or ``"18 and 30"`` (a k equal to both is every layer
    of the partner).  ``res``: a :class:`synclib.analysis.results.Results`."""
    rows = []
    for _, runs in res.units():
        ds = res.analysis(runs[0].name)
        ks = ds["sync_r2_topk"]["k"].values
        n_dir = sum(res.analysis(r.name).sizes["direction"] for r in runs)
        depths = sorted({int(ds.attrs[f"n_layers_{s}"]) for s in "ab" if f"n_layers_{s}" in ds.attrs})
        for k in ks:
            v = res.unit_value(runs, "sync_r2_topk", condition="genuine", k=k)
            if v["n_values"] == n_dir:  # k beyond a target model's depth is NaN: no mixed means
                rows.append({**res.unit_info(runs), "k": int(k), "mean": v["mean"], "se": v["se"],
                             "target_layers": " and ".join(map(str, depths))})
    return res.mark_present(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders", "k", "mean",
                                                    "se", "target_layers"]), "sync_r2_topk")


def topk_correlations(res) -> pd.DataFrame:
    """Figure 7: Pearson r of top-k SyncR² (:func:`topk_table`) with social performance per family and k."""
    social = res.social_table().set_index("pair")["social"]
    topk = topk_table(res)
    topk["social"] = topk["pair"].map(social)
    rows = []
    for k, sub in topk.groupby("k"):
        cors = stats.correlations_by_group(sub, "social", "mean", by="family")
        for _, c in cors.iterrows():
            rows.append({"group": c["group"], "k": int(k), "n": int(c["n"]), "r": c["r"],
                         "p": c["p"], "significant": bool(c["p"] < 0.05) if np.isfinite(c["p"]) else False,
                         "reason": c["reason"]})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- charts
@placeholder_if_empty
def correlation_vs_k(frame: pd.DataFrame, title: str) -> alt.Chart:
    """Pearson r against top-k, one series per group; point size marks p < 0.05.

    ``frame`` columns: ``group, k, r, p, significant`` (rows with NaN r are dropped; when
    none is left, a :func:`~synclib.figures.charts.placeholder` gives the ``reason`` column's reasons).
    """
    need_columns(frame, ["group", "k", "r", "p", "significant"], "correlation_vs_k")
    d = frame.dropna(subset=["r"]).copy()
    if d.empty:
        reasons = sorted(set(frame["reason"].dropna())) if "reason" in frame else []
        return placeholder(title, "no correlation computable: " + ("; ".join(reasons) or "no data"))
    d["significance"] = np.where(d["significant"], "p < 0.05", "p ≥ 0.05")
    return alt.Chart(d).mark_line(point=True).encode(
        x=alt.X("k:O", title="top-k target layers", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("r:Q", title="Pearson r with social performance", scale=alt.Scale(domain=[-1, 1])),
        color=alt.Color("group:N", title="family", scale=colour_scale(d["group"]), legend=alt.Legend(orient="bottom")),
        shape=alt.Shape("group:N", title="family", legend=alt.Legend(orient="bottom")),
        size=alt.Size("significance:N", scale=alt.Scale(domain=["p < 0.05", "p ≥ 0.05"], range=[120, 30]),
                      legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("group:N"), alt.Tooltip("k:O"), alt.Tooltip("r:Q", format=".3f"),
                 alt.Tooltip("p:Q", format=".3g")],
    ).properties(title=title, width=560,  # the whole chart, legends included, fits the text column
                 autosize=alt.AutoSizeParams(type="fit-x", contains="padding"))


# --------------------------------------------------------------------------- sentence
def sentence_topk(topk: pd.DataFrame, cors: pd.DataFrame, published: dict) -> str:
    """How top-k SyncR² changes with k, and the correlations that could be computed."""
    p = published["fig7"]
    if topk.empty:
        return empty_note("top-k sensitivity analysis", "sync_r2_topk", topk) + paper_note(p, p["claim"])
    parts = []
    for pair, t in topk.groupby("pair", sort=False):
        t = t.sort_values("k")
        last, depths = int(t["k"].iloc[-1]), str(t["target_layers"].iloc[-1]) if "target_layers" in t else ""
        of = (", all its partner's layers" if depths == str(last) else
              f", of the partners' {depths} layers" if " and " in depths else
              f", of its partner's {depths} layers" if depths else "")
        parts.append(f"{pair} from {_f(t['mean'].iloc[0])} (k = {int(t['k'].iloc[0])}) to {_f(t['mean'].iloc[-1])} "
                     f"(k = {last}{of})")
    s = ("Averaging the top k target layers instead of the best one changes each pair's SyncR²: "
         + "; ".join(parts) + ".")
    ok = cors.dropna(subset=["r"])
    if ok.empty:
        reasons = sorted(set(cors["reason"].dropna()))
        s += (" No correlation with social performance could be computed for any group and k ("
              + "; ".join(reasons) + ").")
    else:
        lo = ok.loc[ok["r"].idxmin()]
        hi = ok.loc[ok["r"].idxmax()]
        s += (f" Where a correlation could be computed, r ranges from {_f(lo['r'])} "
              f"({lo['group']}, k = {lo['k']}) to {_f(hi['r'])} ({hi['group']}, k = {hi['k']}); "
              f"{int(ok['significant'].sum())} of {len(ok)} have p < 0.05.")
    return s + paper_note(p, p["claim"])


# --------------------------------------------------------------------------- claim
def topk(res, published: dict) -> Claim:
    """Figure 7: the correlation with social performance holds for every top-k."""
    what = "The correlation holds for every top-k (appendix C.1, figure 7)"
    enough, text = pairs_text(res)
    if not enough:
        return Claim("fig7", what, CANNOT, text + "; the top-k SyncR² itself is on the figure 7 page.")
    t = topk_correlations(res)
    t = t[np.isfinite(t["r"].astype(float))] if len(t) else t
    if t.empty:
        return Claim("fig7", what, CANNOT, text + "; no family has enough pairs for a correlation.")
    held = int((t["significant"] & (t["r"] > 0)).sum())
    text += f"; positive at p < 0.05 for {held} of {len(t)} (family, k) correlations"
    return Claim("fig7", what, AGREES if held == len(t) else DIFFERS, text + ".")


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((topk, "fig7"),)
