"""Figure 2: SyncR² heatmaps per pair and direction (section 3.2).

The notebook ``notebooks/fig02_heatmaps.md`` draws this page from the functions here: the
heatmaps of :meth:`synclib.analysis.results.Results.heatmap_frames` (:func:`heatmap_grid`, shared with
figures 3-4) and their sentence (:func:`sentence_fig2`), how well the maps generalise
(:func:`generalisation_table`, :func:`generalisation_summary`, :func:`generalisation_scatter`,
:func:`sentence_generalisation`) and the claim (:func:`synchrony`).
"""
from __future__ import annotations

import math
import warnings

import altair as alt
import numpy as np
import pandas as pd
import xarray as xr

from synclib.analysis import power
from synclib.analysis.results import layer_offset
from synclib.figures.charts import colour_scale, need_columns, placeholder_if_empty, heatmap_grid, wrap_title
from synclib.figures.report import empty_note, join_words, paper_note
from synclib.figures.verdicts import AGREES, CANNOT, DIFFERS, PARTLY, Claim, Measure, p_test, significant, who
from synclib.stats import fmt as _f

__all__ = ["heatmap_grid", "sentence_fig2", "generalisation_table", "generalisation_summary", "generalisation_scatter",
           "sentence_generalisation", "synchrony", "CLAIMS"]


# --------------------------------------------------------------------------- the heatmaps
def sentence_fig2(frames: dict[str, pd.DataFrame], published: dict, direction: str) -> str:
    """Mean best-target R² per pair and the share of negative cells."""
    parts, neg, total = [], 0, 0
    frames = {name: f[f["r2"].astype(float).notna()] for name, f in frames.items()}
    if not any(len(f) for f in frames.values()):
        return (f"No layer pair has a test R² in this run ({direction}): too few samples to fit a map."
                + paper_note(published["fig2"], published["fig2"]["claim"]))
    for name, f in frames.items():
        best = f.loc[f["best"], "r2"]
        parts.append(f"{_f(best.mean())} ({name})")
        neg += int((f["r2"] < 0).sum())
        total += len(f)
    share = 100.0 * neg / total if total else math.nan
    s = (f"Averaged over source layers and split seeds, the best target layer explains "
         f"{join_words(parts)} of the test variance of the partner's next state ({direction}: one direction of one "
         f"ordered run, before clipping; a pair's SyncR² on the first page averages both directions of every "
         f"order played); {_f(share, 0)}% of the {total} layer pairs shown have negative R² (grey).")
    return s + paper_note(published["fig2"], published["fig2"]["claim"])


# --------------------------------------------------------------------------- how well the maps generalise
def generalisation_table(res, runs=None) -> pd.DataFrame:
    """How well the maps generalise: per ordered run, direction and layer pair, the genuine
    maps' training R² (``train_r2``: the same maps scored on their training rows) beside
    their test R² (``r2``), each the mean over the split seeds that have both.  ``res``: a
    :class:`synclib.analysis.results.Results`.

    ``runs``: a run name, a list of them, or None for every run; runs whose analysis lacks
    ``train_r2`` (written before it was stored) are left out.

    Returns
    -------
    DataFrame
        ``run, pair, family, direction, source, target`` (the source and target models),
        ``src_layer, tgt_layer`` (1-based as :meth:`~synclib.analysis.results.Results.heatmap_frame`, padding dropped),
        ``train_r2, test_r2, gap`` (train - test) and ``n_seeds``.
    """
    cols = ["run", "pair", "family", "direction", "source", "target", "src_layer", "tgt_layer",
            "train_r2", "test_r2", "gap", "n_seeds"]
    names = [runs] if isinstance(runs, str) else list(runs) if runs else res.run_names
    parts = []
    for name in names:
        r, ds = res.run(name), res.analysis(name)
        if "train_r2" not in ds or "r2" not in ds:
            continue
        train, test = (ds[v].sel(condition="genuine") for v in ("train_r2", "r2"))
        if "split_seed" not in train.dims:
            train, test = train.expand_dims("split_seed"), test.expand_dims("split_seed")
        ok = np.isfinite(train) & np.isfinite(test)
        with warnings.catch_warnings():  # layer pairs without values (padding): NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            both = xr.Dataset({"train_r2": train.where(ok).mean("split_seed"),
                               "test_r2": test.where(ok).mean("split_seed"), "n_seeds": ok.sum("split_seed")})
        t = both.to_dataframe().reset_index()
        t = t[t["n_seeds"] > 0]
        offset = layer_offset(ds["src_layer"])
        ab = t["direction"] == "A->B"
        parts.append(t.assign(run=r.name, pair=r.pair, family=r.family,
                              source=np.where(ab, r.model_a, r.model_b), target=np.where(ab, r.model_b, r.model_a),
                              src_layer=t["src_layer"].astype(int) + offset,
                              tgt_layer=t["tgt_layer"].astype(int) + offset,
                              gap=t["train_r2"] - t["test_r2"], n_seeds=t["n_seeds"].astype(int)))
    out = pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)
    return res.mark_present(out, "train_r2")


def generalisation_summary(res, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per ordered run, over the layer pairs of both directions of :func:`generalisation_table`
    (``table``; None: ``res``'s): the median training and test R², the ``gap_median`` and
    ``gap_mean`` of train - test, ``share_positive`` (the share of layer pairs whose test R²
    is above 0), ``layer_pairs``, and the samples per genuine dataset (``n_train``,
    ``n_test``: the mean over directions and split seeds of
    :meth:`~synclib.analysis.results.Results.sample_counts`; NaN where the analysis does not record them)."""
    t = generalisation_table(res) if table is None else table
    counts = res.sample_counts()
    counts = counts[counts["condition"] == "genuine"]
    rows = []
    for run, sub in t.groupby("run", sort=False):
        c = counts[counts["run"] == run]
        rows.append({"run": run, "pair": sub["pair"].iloc[0], "family": sub["family"].iloc[0],
                     "layer_pairs": len(sub), "train_median": float(sub["train_r2"].median()),
                     "test_median": float(sub["test_r2"].median()), "gap_median": float(sub["gap"].median()),
                     "gap_mean": float(sub["gap"].mean()), "share_positive": float((sub["test_r2"] > 0).mean()),
                     "n_train": float(c["n_train"].mean()) if len(c) else math.nan,
                     "n_test": float(c["n_test"].mean()) if len(c) else math.nan})
    return res.mark_present(pd.DataFrame(rows, columns=["run", "pair", "family", "layer_pairs", "train_median",
                                                     "test_median", "gap_median", "gap_mean", "share_positive",
                                                     "n_train", "n_test"]), "train_r2")


@placeholder_if_empty
def generalisation_scatter(frame: pd.DataFrame, title: str, size: int = 360, floor: float = -1.0) -> alt.LayerChart:
    """Test R² (y) against training R² (x), one point per layer pair, coloured by ordered run,
    with the diagonal (test = training: no loss) and a rule at test R² 0.

    ``frame``: :func:`generalisation_table` (``run, direction,
    src_layer, tgt_layer, train_r2, test_r2, gap``).  Test R² below ``floor`` is drawn at
    ``floor`` (the title says so; hover shows the value).
    """
    cols = ["run", "direction", "source", "target", "src_layer", "tgt_layer", "train_r2", "test_r2", "gap"]
    need_columns(frame, cols, "generalisation_scatter")
    d = frame[cols].dropna(subset=["train_r2", "test_r2"]).round({"train_r2": 4, "test_r2": 4, "gap": 4})
    vals = np.r_[d["train_r2"].to_numpy(float), d["test_r2"].to_numpy(float)]
    lo, hi = min(max(float(vals.min()), floor), 0.0), max(float(vals.max()), 1e-6)
    if (d["test_r2"] < floor).any():
        title = f"{title} (test R² below {floor:g} drawn at {floor:g})"
    scale = alt.Scale(domain=[lo, hi], clamp=True)
    points = alt.Chart(d).mark_circle(size=30, opacity=0.6).encode(
        # a tick every 50 pixels or so: 13 ticks of 0.1 on the 360-pixel axis left "-0.3-0.2" touching
        x=alt.X("train_r2:Q", title="training R² (mean over split seeds)", scale=scale,
                axis=alt.Axis(tickCount=max(2, size // 50))),
        y=alt.Y("test_r2:Q", title="test R² (mean over split seeds)", scale=scale,
                axis=alt.Axis(tickCount=max(2, size // 50))),
        color=alt.Color("run:N", title="ordered run", scale=colour_scale(d["run"]), legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("run:N", title="ordered run"), alt.Tooltip("direction:N"),
                 alt.Tooltip("source:N", title="source model"), alt.Tooltip("target:N", title="target model"),
                 alt.Tooltip("src_layer:O", title="source layer"), alt.Tooltip("tgt_layer:O", title="target layer"),
                 alt.Tooltip("train_r2:Q", title="training R²", format=".3f"),
                 alt.Tooltip("test_r2:Q", title="test R²", format=".3f"),
                 alt.Tooltip("gap:Q", title="training − test", format=".3f")])
    diagonal = alt.Chart(pd.DataFrame({"x": [lo, hi], "y": [lo, hi]})).mark_line(
        color="grey", strokeDash=[4, 3]).encode(x="x:Q", y="y:Q")
    zero = alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="black", strokeWidth=0.8).encode(y="y:Q")
    return alt.layer(diagonal, zero, points).properties(
        title=alt.TitleParams(wrap_title(title, size + 60, 13)), width=size, height=size)


def sentence_generalisation(summary: pd.DataFrame, published: dict, embedded: bool = False) -> str:
    """How much the maps lose from training to test R² per ordered run
    (:func:`generalisation_summary`): the median and mean gap, the
    median R² on each side, the share of layer pairs with a positive test R² and the samples
    per dataset; then the paper's discussion."""
    p = published["fig2"]
    paper = paper_note({"source": p.get("generalisation_source", p.get("source"))}, p.get("generalisation", p["claim"]))
    if summary.empty:
        return empty_note("training R² of the maps", "train_r2", summary) + paper
    parts = []
    for _, r in summary.iterrows():
        n = (f", on a mean of {_f(r['n_train'], 0)} training and {_f(r['n_test'], 0)} test samples per dataset"
             if np.isfinite(r["n_train"]) and np.isfinite(r["n_test"]) else "")
        parts.append(f"{r['run']} loses a median of {_f(r['gap_median'], 3)} (mean {_f(r['gap_mean'], 3)}; median "
                     f"training R² {_f(r['train_median'], 3)}, test {_f(r['test_median'], 3)}) and keeps a positive "
                     f"test R² in {_f(100.0 * r['share_positive'], 0)}% of its {int(r['layer_pairs'])} layer pairs{n}")
    tiny_models = ("These are the embedded tiny models, not the paper's: with so few samples per dataset the gap says how "
           "much these maps overfit, not how the paper's maps do. " if embedded else "")
    s = (tiny_models + "From training to test R² (the genuine maps of every layer pair, both directions, each R² the mean "
         "over split seeds), " + "; ".join(parts) + ".")
    return s + paper


# --------------------------------------------------------------------------- claim
#: ours: when the maps "generalise well" (the paper's words, with no number): in every ordered run the
#: median layer pair keeps at least ``kept`` of its training R² on the test rows and at least
#: ``positive`` of the layer pairs have a test R² above 0 (:func:`generalisation_summary`)
GENERALISES = {"kept": 0.5, "positive": 0.75}


def generalises(res) -> tuple[bool | None, str]:
    """Whether the genuine maps generalise by :data:`GENERALISES`, and the numbers in words;
    None where the analysis stores no training R²."""
    g = generalisation_summary(res)
    if g.empty:
        return None, "the maps' training R² is not stored, so whether they generalise is not measured"
    kept = g["test_median"] / g["train_median"]
    ok = bool(((kept >= GENERALISES["kept"]) & (g["share_positive"] >= GENERALISES["positive"])).all())
    parts = "; ".join(f"{r.run}: median test R² {_f(r.test_median, 3)} against training {_f(r.train_median, 3)} "
                      f"(kept {_f(100 * k, 0)} %), {_f(100 * r.share_positive, 0)} % of layer pairs above 0"
                      for r, k in zip(g.itertuples(), kept))
    rule = (f"(ours, the paper gives no number: the median layer pair keeps at least "
            f"{_f(100 * GENERALISES['kept'], 0)} % of its training R² and at least "
            f"{_f(100 * GENERALISES['positive'], 0)} % of layer pairs are above 0, in every ordered run)")
    return ok, f"{parts} {rule}"


def synchrony(res, published: dict) -> Claim:
    """Figure 2: the maps predict the partner's next state, beyond what dialogs that never met
    share (genuine against its surrogate partners; SyncR² is above 0 for unrelated states too,
    so 0 is not a null that can happen)."""
    what = "Synchrony: the maps predict the partner's next state and generalise (section 3.2, figure 2; section 6)"
    sync = res.sync_table()
    if not np.isfinite(sync["mean"]).any():
        return Claim("fig2", what, CANNOT, "this run has no genuine SyncR² (too few samples to fit the maps).")
    pairs = "; ".join(f"{r.pair} {_f(r.mean)}" for r in sync.itertuples())
    text = f"{who(res)} genuine SyncR² {pairs} (per pair, the mean of its directional values)"
    t = power.surrogate_test(res)
    if not t["n_surrogates"]:
        return Claim("fig2", what, CANNOT, text + "; this run has no surrogate partners (analysis.surrogates), and "
                     "SyncR² = 0 is no null: the clip and the maximum over target layers keep it above 0 for "
                     "unrelated states.")
    text += (f"; over all runs, against {t['n_surrogates']} surrogate partners per dialog (dialogs that never met; "
             f"{_f(100 * (1 - t['same_personas']), 0)} % of their samples change the personas too): genuine "
             f"{_f(t['genuine'])}, surrogates {_f(t['surrogate_mean'])} on average (at most {_f(t['surrogate_max'])}), "
             f"gap {_f(t['gap'], 3)}")
    if t["n_boot"]:
        text += f", 95 % interval {_f(t['ci_lo'], 3)} to {_f(t['ci_hi'], 3)} over {t['n_boot']:,} resamples of the " \
                f"{t['n_episodes']} episodes"
    text += f", {p_test(t['p'])} (the rank test's floor with {t['n_surrogates']} surrogates: {_f(t['p_floor'], 3)})"
    m = (Measure("gap to surrogate partners", t["gap"], t["ci_lo"], t["ci_hi"], t["p"], unit="SyncR²"),)
    if significant(t["p"]) and t["gap"] > 0:
        ok, words = generalises(res)
        if ok:
            return Claim("fig2", what, AGREES, text + f"; the maps generalise: {words}.", m)
        why = "the maps do not generalise well" if ok is False else "generalisation untested"
        return Claim("fig2", what, PARTLY, text + f": above the surrogates, but {why}: {words}.", m)
    floor = t["p_floor"]
    if floor >= 0.05:
        return Claim("fig2", what, CANNOT, text + f"; with {t['n_surrogates']} surrogates the rank test cannot go "
                     f"below p = {_f(floor, 3)}.", m)
    return Claim("fig2", what, DIFFERS, text + "; genuine is not above the surrogates.", m)


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((synchrony, "fig2"),)
