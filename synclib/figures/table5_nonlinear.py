"""Table 5: nonlinear (MLP) maps against affine ones (appendix I).

The notebook ``notebooks/table5_nonlinear.md`` draws this page from the functions here:
:func:`table` (ours, per pair), :func:`mlp_training` and :func:`sentence_mlp_training` (how long
the MLPs trained), then what table 2 shares with it: the paper's rows beside ours
(:func:`~synclib.figures.report.comparison_with_paper`, :func:`~synclib.figures.report.wide_table`), the bars
(:func:`~synclib.figures.charts.comparison_bars`) and the sentence
(:func:`~synclib.figures.report.sentence_comparison`).
"""
from __future__ import annotations

import pandas as pd

from synclib import stats
from synclib.figures.charts import comparison_bars
from synclib.figures.report import comparison_with_paper, sentence_comparison, wide_table
from synclib.figures.verdicts import Claim, setting_claim

__all__ = ["table", "mlp_training", "sentence_mlp_training", "comparison_with_paper", "wide_table",
           "comparison_bars", "sentence_comparison", "nonlinear", "CLAIMS"]


def table(res, settings: tuple[str, str] = ("affine", "nonlinear")) -> pd.DataFrame:
    """Table 5: test R² of the affine and the MLP map on the same layer pairs.

    The analysis fits the MLP only on a few layer pairs per direction (``layer_pair``:
    evenly spaced source layers, each with its best affine target), so this is the mean
    test R² over those pairs (``affine_r2``, ``nonlinear_r2``), directions and runs
    averaged, per split seed; not a full SyncR².  Column ``n_layer_pairs`` says how many.
    """
    rows = []
    for _, runs in res.units_with("nonlinear_r2"):
        for setting, var in zip(settings, ("affine_r2", "nonlinear_r2")):
            n_lp = int(res.analysis(runs[0].name)[var].sizes.get("layer_pair", 1))
            m, s = stats.mean_se(res.per_seed_pooled(runs, var))
            rows.append({**res.unit_info(runs), "setting": setting, "mean": m, "se": s,
                         "n_layer_pairs": n_lp})
    return res.mark_present(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders", "setting",
                                                    "mean", "se", "n_layer_pairs"]), "nonlinear_r2")


def mlp_training(res) -> pd.DataFrame:
    """Table 5's MLPs, one row per fitted map (run, direction, split seed, layer pair): its
    ``epochs`` (early stopping, ``nonlinear_stopping``), ``steps`` (epochs x minibatches per
    epoch) and ``cap`` (the most epochs allowed)."""
    rows = []
    for r in res.runs:
        ds = res.analysis(r.name)
        if "nonlinear_epochs" in ds:
            t = ds[["nonlinear_epochs", "nonlinear_steps_per_epoch"]].to_dataframe().reset_index()
            t = t[t["nonlinear_epochs"] > 0]
            rows.append(pd.DataFrame({"run": r.name, "direction": t["direction"], "split_seed": t["split_seed"],
                                      "layer_pair": t["layer_pair"], "epochs": t["nonlinear_epochs"],
                                      "steps": t["nonlinear_epochs"] * t["nonlinear_steps_per_epoch"],
                                      "cap": int(ds.attrs.get("nonlinear_max_epochs", -1))}))
    cols = ["run", "direction", "split_seed", "layer_pair", "epochs", "steps", "cap"]
    return res.mark_present(pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols),
                        "nonlinear_epochs")


def sentence_mlp_training(training: pd.DataFrame) -> str:
    """How long table 5's MLPs trained (:func:`mlp_training`)."""
    if training is None or training.empty:
        return "This run's analyses record no MLP training lengths (re-analyse to add them)."
    e, st = training["epochs"], training["steps"]
    cap = int(training["cap"].max())
    at_cap = int((e >= cap).sum()) if cap > 0 else 0
    return (f"Early stopping on the validation part chose {int(e.min())}-{int(e.max())} epochs (median "
            f"{int(e.median())}) for the {len(training)} maps, {int(st.min()):,}-{int(st.max()):,} AdamW steps "
            f"(median {int(st.median()):,}) on the whole training set; "
            + (f"{at_cap} of them were still improving at the cap of {cap} epochs (the paper's 200), so those are "
               "not converged." if at_cap else f"every map stopped before the cap of {cap} epochs."))


def nonlinear(res, published: dict) -> Claim:
    """Table 5: nonlinear maps do not capture systematically more than affine ones."""
    return setting_claim(res, "table5", "nonlinear", "Nonlinear maps no better overall than affine ones "
                          "(appendix I, table 5)", "this run has no MLP comparison (or one split seed).",
                          one_sided=True)


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((nonlinear, "table5"),)
