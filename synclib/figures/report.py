"""Sentences and tables that put our numbers beside the paper's.

Each ``sentence_*`` function takes the tidy table a notebook drew (from
:class:`synclib.analysis.results.Results`) and the published numbers
(:func:`synclib.analysis.results.load_published`) and returns Markdown: one sentence computed from
the table, then the paper's number or claim with its source.  Nothing in a sentence is
written in advance: every number, comparison word and count comes from the table.

The book's generated pages live elsewhere: the run summary and the embedded models page's
account of the run in :mod:`synclib.figures.run_summary`, the benchmarks page in :mod:`synclib.figures.benchmarks`.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from synclib.stats import fmt as _f
from synclib.stats import format_p

__all__ = ["banner", "readable",
           "sample_counts_text", "comparison_with_paper", "wide_table", "sentence_comparison",
           "passive_share", "passive_share_value", "ASSUMED_PAPER_DIFFERENCE", "interval_text"]

#: The genuine-passive SyncR² difference taken as the paper's where a run is judged against
#: it (the controls and the power pages).  The paper prints no number for it (figure 4a is a
#: bar chart without values): a stated assumption, said so wherever it is used.
ASSUMED_PAPER_DIFFERENCE = 0.1


def interval_text(row) -> str:
    """``"0.012 to 0.034"``: the 95 % interval of a paired test's row over episodes
    (:func:`synclib.analysis.power.episode_test`), or ``"—"`` where it has none."""
    return f"{_f(row['ci_lo'], 3)} to {_f(row['ci_hi'], 3)}" if np.isfinite(row.get("ci_lo", math.nan)) else "—"


def paper_note(entry: dict, text: str) -> str:
    return f"\n\n*Paper ({entry.get('source', 'source not given')}):* {text}"


def join_words(items: list[str]) -> str:
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def banner(res) -> str:
    """A warning line for synthetic test data; an empty string for a real run."""
    if res.synthetic:
        return ("**Synthetic test data.** These numbers come from a random generator used by "
                "the test suite; they are not results of any model.\n\n")
    return ""


def empty_note(what: str, var: str, table: pd.DataFrame | None = None) -> str:
    """Why a table has nothing to show: the analyses lack ``var``, or (``table.attrs["present"]``,
    set by :class:`synclib.analysis.results.Results`) they have it but no value could be computed."""
    if table is not None and table.attrs.get("present"):
        return (f"This run's analyses hold the {what} (`{var}`), but none of its values could be computed (too few "
                "samples to fit the maps), so there is nothing to compare.")
    return (f"This run has no {what} (the analysis files lack `{var}`), so there is nothing "
            "to compare; enable it in the run configuration and re-run `make book`.")


# --------------------------------------------------------------------------- figures 3, 4 (and the run summary)
def _passive_pairs(sync: pd.DataFrame, passive: pd.DataFrame | None) -> pd.DataFrame:
    """Genuine (``mean_g``) and passive (``mean_p``) SyncR² of the pairs that have both, genuine above 0."""
    if passive is None or passive.empty:
        return pd.DataFrame(columns=["pair", "mean_g", "mean_p"])
    m = sync[["pair", "mean"]].merge(passive[["pair", "mean"]], on="pair", suffixes=("_g", "_p"))
    return m[np.isfinite(m["mean_g"]) & np.isfinite(m["mean_p"]) & (m["mean_g"] > 0)]


def passive_share_value(sync: pd.DataFrame, passive: pd.DataFrame | None) -> float:
    """The share (in %) of genuine SyncR² the passive reader keeps, the mean over the pairs that
    have both (:func:`passive_share` words it); NaN where none has."""
    m = _passive_pairs(sync, passive)
    return float(100 * (m["mean_p"] / m["mean_g"]).mean()) if len(m) else float("nan")


def passive_share(sync: pd.DataFrame, passive: pd.DataFrame | None) -> str:
    """What share of genuine SyncR² the passive reader keeps, over the pairs that have both:
    ``"the passive reader keeps 92 % of genuine SyncR² (S-S 0.40 of 0.43, ...)"``, or ``""``."""
    m = _passive_pairs(sync, passive)
    if m.empty:
        return ""
    share = passive_share_value(sync, passive)
    return (f"the passive reader, who reads the same dialog without taking part in it, keeps {share:.0f} % of "
            f"genuine SyncR² (the mean over pairs; " + join_words([f"{r.pair} {_f(r.mean_p)} of {_f(r.mean_g)}"
                                                           for r in m.itertuples()]) + ")")


# --------------------------------------------------------------------------- tables as a page shows them
def readable(table: pd.DataFrame, digits: int = 3):
    """``table`` for a page: no row numbers, numbers to ``digits`` decimals, columns named
    ``p`` or ending in `` p`` as :func:`synclib.stats.format_p` writes p-values, missing
    values as a dash, text cells whole (pandas would cut them at 50 characters)."""
    import html

    def cell(write):
        return lambda x: "–" if x is None or not np.isfinite(x) else write(x)

    fmt = {c: cell(lambda x: html.escape(format_p(x))) if c == "p" or str(c).endswith(" p")
           else cell(lambda x: f"{x:.{digits}f}")
           for c in table.columns if pd.api.types.is_float_dtype(table[c])}
    return table.style.hide(axis="index").format(fmt, na_rep="–", escape="html").set_table_attributes(
        'class="dataframe"')


# --------------------------------------------------------------------------- dataset sizes (every page)
def sample_counts_text(res) -> str:
    """The run's dataset sizes from :meth:`synclib.analysis.results.Results.sample_counts` (the one count):
    training and test samples per dataset for each condition, as ranges over ordered runs,
    directions and split seeds; conditions with the same ranges are named together."""
    c = res.sample_counts()
    if c.empty:
        return ""

    def span(v) -> str:
        lo, hi = int(v.min()), int(v.max())
        return f"{lo}" if lo == hi else f"{lo}-{hi}"

    groups: dict = {}
    for cond, t in c.groupby("condition", sort=False):
        groups.setdefault((span(t["n_train"]), span(t["n_test"])), []).append(str(cond))
    parts = [f"{join_words(conds)} {tr} for training and {te} for testing" for (tr, te), conds in groups.items()]
    return ("Samples per dataset, as the analysis split them (the range over ordered runs, directions and "
            "split seeds): " + "; ".join(parts) + ".")


# --------------------------------------------------------------------------- tables 2, 5
def comparison_with_paper(ours: pd.DataFrame, entry: dict) -> pd.DataFrame:
    """Tables 2 / 5 in long form, ours and the paper's rows, for :func:`synclib.figures.charts.comparison_bars`.

    Returns columns ``label, setting, mean, se, source``.
    """
    rows = [{"label": f"ours: {r['pair']}", "setting": r["setting"], "mean": r["mean"],
             "se": r["se"], "source": "ours"} for _, r in ours.iterrows()]
    for row in entry["rows"]:
        for setting in entry["settings"]:
            m, s = row[setting]
            rows.append({"label": f"paper: {row['pair']}", "setting": setting, "mean": m,
                         "se": s, "source": "paper"})
    return pd.DataFrame(rows, columns=["label", "setting", "mean", "se", "source"])


def wide_table(long: pd.DataFrame) -> pd.DataFrame:
    """``label x setting`` table of ``mean ± se`` strings (for display); "n/a" where the run has
    no value."""
    cell = long.assign(value=[f"{m:.2f} ± {s:.2f}" if np.isfinite(m) and np.isfinite(s) else _f(m)
                              for m, s in zip(long["mean"], long["se"])])
    return cell.pivot(index="label", columns="setting", values="value").reindex(
        index=list(dict.fromkeys(long["label"])), columns=list(dict.fromkeys(long["setting"]))).fillna("n/a")


def sentence_comparison(ours: pd.DataFrame, entry: dict, what: str, var: str,
                        quantity: str = "SyncR²") -> str:
    """Difference between the two settings, ours and the paper's.

    ``quantity`` names what our numbers are (e.g. when they are not a full SyncR²).
    """
    a, b = entry["settings"]
    pub = "; ".join(f"{r['pair']} {r[a][0]:.2f} / {r[b][0]:.2f}" for r in entry["rows"])
    pub = f"{a} / {b}: {pub}."
    if ours.empty:
        return empty_note(what, var, ours) + paper_note(entry, pub)
    w = ours.pivot(index="pair", columns="setting", values="mean")
    d = (w[b] - w[a]).dropna() if {a, b} <= set(w.columns) else pd.Series(dtype=float)
    if d.empty:
        return (f"No pair of this run has a {quantity} in both settings (too few samples to fit them), so there is "
                "nothing to compare." + paper_note(entry, pub))
    s = (f"{b.capitalize()} minus {a} {quantity} over our {len(d)} pairs: mean {d.mean():+.3f} "
         f"(from {d.min():+.3f} to {d.max():+.3f}); {int((d > 0).sum())} of {len(d)} pairs are "
         f"higher with the {b} setting.")
    return s + paper_note(entry, pub)


