"""Figure 11: Theory-of-Mind decoding of emotions and actions (appendix J).

The notebook ``notebooks/fig11_tom.md`` draws this page from the functions here: the decoders'
and the baseline's test KL (:meth:`synclib.analysis.results.Results.tom_table`, which the run summary
reads too) as bars (:func:`~synclib.figures.charts.grouped_bars`, shared with figures 3-4), and
:func:`sentence_tom`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from synclib.analysis import power
from synclib.figures.charts import grouped_bars
from synclib.figures.report import empty_note, join_words, paper_note
from synclib.figures.verdicts import AGREES, CANNOT, DIFFERS, Claim
from synclib.stats import fmt as _f
from synclib.stats import p_clause as _p

__all__ = ["grouped_bars", "sentence_tom", "tom", "CLAIMS"]


def sentence_tom(table: pd.DataFrame, published: dict) -> str:
    """How many decoders beat the train-mean baseline."""
    p = published["fig11"]
    if table.empty:
        return empty_note("Theory-of-Mind decoding", "tom_kl", table) + paper_note(p, p["claim"])
    keys = ["pair", "target", "relation"]
    dec = table[table["decoder_or_baseline"] == "decoder"].set_index(keys)["mean"]
    base = table[table["decoder_or_baseline"] == "baseline"].set_index(keys)["mean"]
    both = pd.concat({"dec": dec, "base": base}, axis=1).dropna()
    if both.empty and not np.isfinite(dec.astype(float)).any():
        return "No decoder could be fitted in this run (too few ToM samples)." + paper_note(p, p["claim"])
    if both.empty:
        return ("This run has decoders but no baseline KL to compare with."
                + paper_note(p, p["claim"]))
    better = int((both["dec"] < both["base"]).sum())
    parts = []
    for (target, rel), sub in both.groupby(level=["target", "relation"], sort=False):
        parts.append(f"{target} from {rel}: {int((sub['dec'] < sub['base']).sum())} of {len(sub)}")
    s = (f"The decoders reach a lower test KL than the train-mean baseline in {better} of "
         f"{len(both)} cases (mean KL {_f(both['dec'].mean(), 3)} vs baseline "
         f"{_f(both['base'].mean(), 3)}; by target and source: {'; '.join(parts)}).")
    dec_rows = table[table["decoder_or_baseline"] == "decoder"]
    if {"n_train", "n_test"} <= set(table.columns) and np.isfinite(dec_rows["n_test"]).any():
        def span(v):
            lo, hi = np.nanmin(v), np.nanmax(v)
            return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"

        per = [f"{target} decoders on {span(t['n_train'])} training and {span(t['n_test'])} test samples"
               for target, t in dec_rows.groupby("target", sort=False) if np.isfinite(t["n_test"]).any()]
        s += (f" Samples per decoder (the mean over reading agents, split seeds and runs, for each pair and "
              f"relation): {join_words(per)}. Chance is the baseline: the training set's mean distribution, what a "
              "decoder that reads nothing from the hidden state achieves.")
    if {"n_kept", "n_dropped"} <= set(table.columns):
        kept, dropped = int(dec_rows["n_kept"].sum()), int(dec_rows["n_dropped"].sum())
        filtered = bool(dec_rows["filtered"].all()) if "filtered" in dec_rows else True
        if kept + dropped and filtered:
            s += (f" Only replies in the instructed \"Emotion. Action type.\" format are decoded, as "
                  f"the paper restricts itself to models that follow it: {dropped} of {kept + dropped} "
                  f"samples ({100 * dropped / (kept + dropped):.0f}%) were dropped for not following it.")
        elif kept + dropped:
            s += (f" The format filter is off for this run (`analysis.tom_format_filter: false`): {dropped} of "
                  f"{kept + dropped} samples ({100 * dropped / (kept + dropped):.0f}%) did not follow the instructed "
                  "\"Emotion. Action type.\" format and are decoded all the same (the paper keeps only models "
                  "that follow it).")
    return s + paper_note(p, p["claim"])


def tom(res, published: dict) -> Claim:
    """Figure 11: emotions and actions of self and partner decode above the baseline."""
    what = "Emotions and actions decode above the baseline (appendix J, figure 11)"
    t = power.tom_tests(res)
    if t.empty:
        return Claim("fig11", what, CANNOT, "this run has no ToM decoding.")
    if not np.isfinite(t["mean"].astype(float)).any():
        return Claim("fig11", what, CANNOT, "no decoder could be fitted in this run (too few ToM samples).")
    ok = t[(t["p"] < 0.05) & (t["mean"] > 0)]
    parts = [f"{r.target} from {r.relation} {_f(r.mean, 3)} ({_p(r.p)})" for r in t.itertuples()]
    text = (f"{len(ok)} of {len(t)} decoders beat the train-mean baseline at p < 0.05 (baseline minus decoder test "
            f"KL, corrected re-split t-test over reading agents x split seeds x runs): " + "; ".join(parts))
    followed = bool(t["format_followed"].all())
    if not followed:  # the paper decodes replies in the format; without it there is nothing of the paper's to test
        return Claim("fig11", what, CANNOT, "the replies did not follow the instructed 'Emotion. Action type.' "
                     "format, which the paper's decoding requires (its targets are read from such replies); for "
                     "the record, " + text + ".")
    return Claim("fig11", what, AGREES if len(ok) else DIFFERS, text + ".")


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((tom, "fig11"),)
