"""Figure 8: SyncR² with negative R² kept (appendix C.2).

The notebook ``notebooks/fig08_clipping.md`` draws this page from the functions here: the table
(:func:`clipping_table`) and its numbers per penalty (:func:`clipping_summary`), the chart
(:func:`clipping_panels`), the sentence beside the paper's claim (:func:`sentence_clipping`) and
the claim (:func:`clipping`).
"""
from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from synclib.figures.charts import colour_scale, need_columns, placeholder_if_empty, with_bounds
from synclib.figures.report import empty_note, paper_note
from synclib.figures.verdicts import AGREES, CANNOT, DIFFERS, PARTLY, Claim
from synclib.penalty import PAPER_ALPHA
from synclib.stats import fmt as _f

__all__ = ["clipping_table", "clipping_summary", "clipping_panels", "sentence_clipping", "clipping", "CLAIMS"]


# --------------------------------------------------------------------------- tables
def clipping_table(res) -> pd.DataFrame:
    """Figure 8: per pair, SyncR² with negatives clipped and kept, at the paper's penalty
    (``penalty`` ``"paper"``: ``paper_alpha_sync_r2[_noclip]``, or the run's own variables
    when its penalty is the paper's) and at the run's own (``"run"``: ``sync_r2[_noclip]``).
    ``res``: a :class:`synclib.analysis.results.Results`.

    Columns ``pair, family, model_a, model_b, orders, penalty, method, mean, se``.
    """
    rows = []
    own_is_paper = res.penalty().is_paper()
    for _, runs in res.units():
        have = all("paper_alpha_sync_r2" in res.analysis(r.name) for r in runs)
        kinds = ([("paper", "sync_r2")] if own_is_paper else
                 [("paper", "paper_alpha_sync_r2")] * have + [("run", "sync_r2")])
        for penalty, prefix in kinds:
            for method, suffix in (("clipped at 0", ""), ("kept", "_noclip")):
                v = res.unit_value(runs, prefix + suffix, condition="genuine")
                rows.append({**res.unit_info(runs), "penalty": penalty, "method": method, "mean": v["mean"],
                             "se": v["se"]})
    return res.mark_present(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders", "penalty",
                                                    "method", "mean", "se"]), "sync_r2_noclip")


def clipping_summary(table: pd.DataFrame) -> dict:
    """Figure 8's numbers from the rows of one penalty of :func:`clipping_table`: the mean
    over pairs of the clipped and kept SyncR² (``clipped``, ``kept``), the median over pairs
    of the ratio of their standard errors (``se_ratio``) and ``alpha`` (the penalty's value,
    NaN for the run's own when it is not a number)."""
    c = table[table["method"] == "clipped at 0"].set_index("pair")
    k = table[table["method"] == "kept"].set_index("pair")
    both = c.join(k, lsuffix="_c", rsuffix="_k").dropna(subset=["mean_c", "mean_k"])
    ratio = (both["se_k"] / both["se_c"]).replace([np.inf, -np.inf], np.nan)
    return {"clipped": float(both["mean_c"].mean()) if len(both) else math.nan,
            "kept": float(both["mean_k"].mean()) if len(both) else math.nan,
            "se_ratio": float(np.nanmedian(ratio)) if ratio.notna().any() else math.nan,
            "n_pairs": len(both),
            "alpha": PAPER_ALPHA if (table["penalty"] == "paper").all() else math.nan}


# --------------------------------------------------------------------------- chart
@placeholder_if_empty
def clipping_panels(frame: pd.DataFrame, title: str, x: str = "pair", x_title: str = "model pair") -> alt.VConcatChart:
    """Upper panel: SyncR² with and without clipping; lower: its SE on a log scale.

    ``frame`` columns: ``pair, family, method, mean, se`` and ``x`` (the bars' groups, e.g. a
    pair and a ridge penalty).
    """
    need_columns(frame, ["pair", "family", "method", "mean", "se", x], "clipping_panels")
    d = with_bounds(frame)
    tips = [alt.Tooltip(f"{x}:N"), alt.Tooltip("family:N"), alt.Tooltip("method:N"),
            alt.Tooltip("mean:Q", format=".3f"), alt.Tooltip("se:Q", format=".3g")]
    xs = alt.X(f"{x}:N", title=x_title, sort=None, axis=alt.Axis(labelAngle=0, labelLimit=160))
    xo = alt.XOffset("method:N")
    color = alt.Color("method:N", title="negative R²", scale=colour_scale(d["method"]))
    upper = alt.layer(
        alt.Chart().mark_bar().encode(x=xs, xOffset=xo, y=alt.Y("mean:Q", title="SyncR²"),
                                      color=color, tooltip=tips),
        alt.Chart().mark_errorbar(ticks=True).encode(x=xs, xOffset=xo,
                                                     y=alt.Y("lo:Q", title="SyncR²"), y2="hi:Q"),
        data=d).properties(width=420, height=200, title="SyncR²")
    pos = d[d["se"] > 0]
    lower = alt.Chart(pos).mark_point(filled=True, size=70).encode(
        x=xs, xOffset=xo, y=alt.Y("se:Q", title="standard error (log scale)",
                                  scale=alt.Scale(type="log")),
        color=color, tooltip=tips).properties(width=420, height=160,
                                              title="standard error of SyncR²")
    return alt.vconcat(upper, lower).properties(title=title)


# --------------------------------------------------------------------------- sentence
def sentence_clipping(table: pd.DataFrame, published: dict, res=None) -> str:
    """Effect of keeping negative R² on SyncR² and its standard error, at each penalty of
    ``table`` (:func:`clipping_table`): the paper's and the run's own."""
    p = published["fig8"]
    if table.empty:
        return empty_note("unclipped SyncR²", "sync_r2_noclip", table) + paper_note(p, p["claim"])
    names = {"paper": "At the paper's penalty λ = 0.1 (the paper's setting)",
             "run": f"At this run's own penalty ({res.penalty_label() if res is not None else 'its own'})"}
    parts = []
    for penalty, t in table.groupby("penalty", sort=False):
        s = clipping_summary(t)
        if not np.isfinite(s["clipped"]):
            continue
        parts.append(f"{names.get(penalty, penalty)}, keeping negative R² changes the mean SyncR² over "
                     f"{s['n_pairs']} pairs from {_f(s['clipped'])} to {_f(s['kept'])} and its standard error by a "
                     f"factor of {_f(s['se_ratio'], 1)} (median over pairs)"
                     + (": no source layer's best mean R² is negative there, so clipping changes nothing by "
                        "construction" if penalty == "run" and abs(s["kept"] - s["clipped"]) < 5e-4 else "") + ".")
    if not parts:
        return empty_note("unclipped SyncR²", "sync_r2_noclip", table) + paper_note(p, p["claim"])
    return " ".join(parts) + paper_note(p, p["claim"])


# --------------------------------------------------------------------------- claim
#: ours: keeping negative R² "lowers" SyncR² at a penalty where the mean over pairs falls by more than this
#: (SyncR²; below it the two differ by rounding)
LOWERS_BY = 0.005


def clipping(res, published: dict) -> Claim:
    """Figure 8: keeping negative R² lowers SyncR² and inflates its standard error."""
    what = "Keeping negative R² lowers SyncR² and inflates its standard error (appendix C.2, figure 8)"
    t = clipping_table(res)
    paper = t[t["penalty"] == "paper"] if len(t) else t
    if paper.empty:
        return Claim("fig8", what, CANNOT, "this run's analyses have no unclipped SyncR².")
    s = clipping_summary(paper)
    if not s["n_pairs"]:
        return Claim("fig8", what, CANNOT, "this run has no SyncR² at the paper's penalty (too few samples to fit "
                                             "the maps).")
    text = (f"at the paper's λ = {s['alpha']:g}, keeping negatives takes the mean SyncR² over pairs from "
            f"{_f(s['clipped'])} to {_f(s['kept'])} and its standard error by a factor of {_f(s['se_ratio'], 1)} "
            "(median over pairs); no test: the unclipped value can never exceed the clipped one, so the size "
            "is the finding")
    lowers = s["clipped"] - s["kept"] > LOWERS_BY
    own = t[t["penalty"] == "run"]
    o = clipping_summary(own) if len(own) else None
    if o is not None and np.isfinite(o["clipped"]):
        text += (f". At this run's own penalty ({res.penalty_label()}) the two are {_f(o['clipped'])} and "
                 f"{_f(o['kept'])}, standard error x {_f(o['se_ratio'], 1)}")
        own_lowers = o["clipped"] - o["kept"] > LOWERS_BY
        if lowers and not own_lowers:
            return Claim("fig8", what, PARTLY, text + f": the paper's effect holds at λ = {s['alpha']:g}, where the "
                         "maps overfit, but not at the penalty the run chose by cross-validation (a fall of more "
                         f"than {LOWERS_BY} SyncR² counts).")
        if not lowers and own_lowers:
            return Claim("fig8", what, PARTLY, text + f": the effect shows at this run's penalty only (a fall of "
                         f"more than {LOWERS_BY} SyncR² counts).")
    verdict = AGREES if lowers else DIFFERS
    return Claim("fig8", what, verdict, text + f" (a fall of more than {LOWERS_BY} SyncR² counts).")


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((clipping, "fig8"),)
