"""Figure 9: SyncR² against the samples per dataset (appendix D).

The notebook ``notebooks/fig09_sample_size.md`` draws this page from the functions here: this
run's sweep (:func:`sample_size_table`, its last points from :func:`dataset_sizes`) and its
chart (:func:`lines_with_se`, shared), the run's dataset sizes (:func:`sample_counts_text`, the
count every page quotes), the sentence beside the paper's claim (:func:`sentence_sample_size`),
the measured curves of the embedded pairs (:func:`curve_table`, from :mod:`synclib.analysis.sizing`, as a
table: :func:`sample_curve_markdown`) and the claim (:func:`sample_size`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from synclib.analysis.sizing import LEAVES_ZERO, curve_table
from synclib.figures.charts import lines_with_se
from synclib.figures.report import empty_note, paper_note, sample_counts_text
from synclib.figures.verdicts import AGREES, CANNOT, DIFFERS, EQUIVALENCE_MARGIN, Claim
from synclib.stats import fmt as _f

__all__ = ["dataset_sizes", "sample_size_table", "lines_with_se", "sample_counts_text", "sentence_sample_size",
           "curve_table", "sample_curve_markdown", "sample_size", "CLAIMS"]


# --------------------------------------------------------------------------- tables
def dataset_sizes(res) -> dict:
    """Per pair with a split, its genuine datasets' samples (training + test), the mean over its runs,
    directions and split seeds (:meth:`synclib.analysis.results.Results.sample_counts`): figure 9's last point
    and its claim's number.  ``res``: a :class:`synclib.analysis.results.Results`."""
    counts = res.sample_counts().query("condition == 'genuine'")
    pair_of = {r.name: r.pair for r in res.runs}
    n = (counts["n_train"] + counts["n_test"]).groupby(counts["run"].map(pair_of)).mean()
    return {p: int(round(n[p])) for p in res.pair_names if p in n.index}


def sample_size_table(res) -> pd.DataFrame:
    """Figure 9: SyncR² per pair and dataset size (reference aggregation).

    The sweep's sizes (``point`` ``"sweep"``), then the pair's genuine SyncR² at the run's
    own full size (``point`` ``"full run"``, ``n_samples`` its mean training plus test
    samples per dataset, :func:`dataset_sizes`) where that is larger than the sweep's largest size.
    """
    var = "sample_size_sync_r2"
    rows, sizes = [], dataset_sizes(res)
    for _, runs in res.units_with(var):
        da = res.analysis(runs[0].name)[var]
        sdim = next(d for d in da.dims if d not in ("direction", "split_seed"))
        for n in da[sdim].values:
            v = res.unit_value(runs, var, **{sdim: n})
            rows.append({**res.unit_info(runs), "n_samples": int(n), "mean": v["mean"], "se": v["se"],
                         "point": "sweep"})
        n = sizes.get(runs[0].pair, 0)
        if n > int(da[sdim].max()):
            v = res.unit_value(runs, "sync_r2", condition="genuine")
            rows.append({**res.unit_info(runs), "n_samples": n, "mean": v["mean"], "se": v["se"],
                         "point": "full run"})
    return res.mark_present(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders",
                                                    "n_samples", "mean", "se", "point"]), var)


# --------------------------------------------------------------------------- sentences
def sentence_sample_size(table: pd.DataFrame, published: dict) -> str:
    """SyncR² at the smallest and largest training sizes, and the last step's gain."""
    p = published["fig9"]
    table = table[np.isfinite(table["mean"].astype(float))]
    if table.empty:
        return empty_note("sample-size analysis", "sample_size_sync_r2", table) + paper_note(p, p["claim"])
    parts = []
    for pair, t in table.groupby("pair", sort=False):
        t = t.sort_values("n_samples")
        first, last = t.iloc[0], t.iloc[-1]
        full = " (the run's full size: the mean over its genuine datasets)" if last.get("point") == "full run" else ""
        part = (f"{pair} from {_f(first['mean'])} with {int(first['n_samples'])} samples per dataset to "
                f"{_f(last['mean'])} with {int(last['n_samples'])}{full}")
        if len(t) > 1:
            prev = t.iloc[-2]
            part += f" (the last step, from {int(prev['n_samples'])}, {_f(last['mean'] - prev['mean'], 3, sign=True)})"
        parts.append(part)
    return "SyncR² goes, " + "; ".join(parts) + "." + paper_note(p, p["claim"])


def sample_curve_markdown(curves: pd.DataFrame) -> str:
    """The measured sample-size curves (:func:`synclib.analysis.sizing.curve_table`) as a Markdown
    table per pair (SyncR² per condition and dataset size) and a sentence on where genuine
    SyncR² leaves 0; a note when there are none."""
    if curves.empty:
        return ("*No measured sample-size curve here (`python bench/bench_sample_curve.py --pair S-S` "
                "writes one).*")
    conds = [c for c in ("genuine", "passive", "shuffled", "lag1", "lag2") if c in set(curves["condition"])]
    out = []
    for pair, t in curves.groupby("pair", sort=True):
        run = curves.attrs.get("runs", {}).get(pair, {})
        st, wall, mach = run.get("settings") or {}, run.get("wall_s") or {}, run.get("machine") or {}
        out += [f"**{pair}** (`{t['source'].iloc[0]}`: one ordered run of {st.get('tasks', '?')} embedded tasks x "
                f"{len(st.get('sim_seeds', [])) or '?'} seed, {st.get('max_utterances', '?')} utterances, "
                f"{st.get('dtype', '?')}, ridge penalty {st.get('alpha', '?')}, {len(st.get('split_seeds', []))} "
                f"split seeds; simulation {_f(wall.get('simulate'), 0)} s and analysis {_f(wall.get('analysis'), 0)} s "
                f"on {mach.get('cpu_count', '?')} cores, {run.get('date', '?')}):", "",
                "| samples per dataset (training) | " + " | ".join(conds) + " |",
                "| --- |" + " --- |" * len(conds)]
        g = t[t["condition"] == "genuine"].sort_values("n_samples", key=lambda x: x.where(x >= 0, 10 ** 9))
        for _, row in g.iterrows():
            n = row["n_samples"]
            cells = []
            for c in conds:
                m = t[(t["condition"] == c) & (t["n_samples"] == n)]
                cells.append(f"{_f(m['mean'].iloc[0])} ± {_f(m['se'].iloc[0])}" if len(m) else "—")
            label = "all" if n < 0 else str(n)
            out.append(f"| {label} ({row['n_train']:.0f}) | " + " | ".join(cells) + " |")
        off = g[(g["mean"] >= LEAVES_ZERO)]
        last0 = g[(g["mean"] < LEAVES_ZERO)]
        out += ["", f"Genuine SyncR² of the embedded {pair} pair is still below {LEAVES_ZERO} at "
                f"{last0['n_train'].max():.0f} training samples and reaches it at {off['n_train'].min():.0f}."
                if len(off) and len(last0) else "", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- claim
def sample_size(res, published: dict) -> Claim:
    """Figure 9: little gain beyond 6,500 samples per dataset."""
    f9 = published.get("fig9", {})
    n = res.sample_counts()
    gen = n[n["condition"] == "genuine"]
    what = f"Little gain beyond {f9.get('n_samples', 6500):,} samples per dataset (appendix D, figure 9)"
    if gen.empty and res.runs_with("n_train"):
        return Claim("fig9", what, CANNOT, "no genuine dataset of this run could be split into training and test "
                                             "samples (too few samples).")
    if gen.empty:
        return Claim("fig9", what, CANNOT, "this run's analyses record no sample counts.")
    sizes = dataset_sizes(res)
    total = max(sizes.values())
    paper_n = f9.get("n_samples", 6500)
    text = ("this run's genuine datasets hold " + ", ".join(f"{p} {n}" for p, n in sizes.items())
            + f" samples each (training + test, the mean over directions and split seeds: figure 9's last points), "
            f"{paper_n:,} in the paper; the curve up to this run's size is on the figure 9 page")
    if total < paper_n:
        return Claim("fig9", what, CANNOT, text + ": the run ends before the paper's size.")
    curve = sample_size_table(res)
    at = curve[curve["n_samples"] <= paper_n].groupby("pair")["mean"].last()
    end = curve.groupby("pair")["mean"].last()
    gain = (end - at).dropna()
    if gain.empty:
        return Claim("fig9", what, CANNOT, text + "; the sweep has no point at or below the paper's size.")
    text += f"; gain beyond it up to {_f(float(gain.max()), 3)} SyncR² (largest over pairs)"
    return Claim("fig9", what, AGREES if gain.max() < EQUIVALENCE_MARGIN else DIFFERS, text + ".")


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((sample_size, "fig9"),)
