"""Sentences and tables that put our numbers beside the paper's.

Each ``sentence_*`` function takes the tidy table a notebook drew (from
:class:`synclib.results.Results`) and the published numbers
(:func:`synclib.results.load_published`) and returns Markdown: one sentence computed from
the table, then the paper's number or claim with its source.  Nothing in a sentence is
written in advance: every number, comparison word and count comes from the table.

:func:`run_summary_markdown` writes the run summary that the book's first page includes
(``book/_generated/run_summary.md``).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from synclib import stats


def _f(x: float, nd: int = 2) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{nd}f}"


def _paper(entry: dict, text: str) -> str:
    return f"\n\n*Paper ({entry.get('source', 'source not given')}):* {text}"


def _join(items: list[str]) -> str:
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


def _empty(what: str, var: str) -> str:
    return (f"This run has no {what} (the analysis files lack `{var}`), so there is nothing "
            "to compare; enable it in the run configuration and re-run `make book`.")


# --------------------------------------------------------------------------- figure 1
def sentence_fig1(fig, published: dict, embedded: bool) -> str:
    """What figure 1's map is (:func:`synclib.illustrate.figure1`), with the paper's caption."""
    i = fig.info
    same = ("the analysis' own value for this layer pair and split" if i["rounded_equal"]
            else "which differs from the analysis' value for this layer pair and split")
    s = (f"The ridge map from agent 1's layer {i['src_layer']} to agent 2's layer {i['tgt_layer']} (the A→B layer "
         f"pair with the highest mean test R² in this run, {_f(i['r2_mean'])} over split seeds), refitted on split seed "
         f"{i['split_seed']} with the analysis' split ({i['n_train']} training and {i['n_test']} test samples) and "
         f"penalty (λ = {i['alpha']:.2g}). Each point is one test sample: agent 2's actual state at the next utterance "
         "against the map's prediction from agent 1's current state, both on the target layer's first principal "
         f"component. Its test R² over all {i['n_test']} samples and every dimension is {i['r2']:.3f}, {same} "
         f"({i['analysis_r2']:.3f}). SyncR² (figure 2) takes each source layer's best target like this one, clips at "
         "0 and averages over layers, directions and speaking orders."
         + (" These are the embedded tiny models, not the paper's." if embedded else ""))
    p = published["fig1"]
    return s + _paper(p, p["caption"])


# --------------------------------------------------------------------------- figure 2
def sentence_fig2(frames: dict[str, pd.DataFrame], published: dict, direction: str) -> str:
    """Mean best-target R² per pair and the share of negative cells."""
    parts, neg, total = [], 0, 0
    for name, f in frames.items():
        best = f.loc[f["best"], "r2"]
        parts.append(f"{_f(best.mean())} ({name})")
        neg += int((f["r2"] < 0).sum())
        total += len(f)
    share = 100.0 * neg / total if total else math.nan
    s = (f"Averaged over source layers and split seeds, the best target layer explains "
         f"{_join(parts)} of the test variance of the partner's next state ({direction}: one direction of one "
         f"ordered run, before clipping; a pair's SyncR² on the first page averages both directions of every "
         f"order played); {_f(share, 0)}% of the {total} layer pairs shown have negative R² (grey).")
    return s + _paper(published["fig2"], published["fig2"]["claim"])


# --------------------------------------------------------------------------- figures 3, 4
def _versus(sync: pd.DataFrame, other: pd.DataFrame, what: str) -> str:
    m = sync[["pair", "mean"]].merge(other[["pair", "mean"]], on="pair", suffixes=("_g", "_c"))
    lower = int((m["mean_c"] < m["mean_g"]).sum())
    return (f"With {what} SyncR² is lower than in the genuine interaction for {lower} of {len(m)} "
            f"pairs (the mean over pairs of each pair's SyncR²: {_f(m['mean_g'].mean())} genuine vs "
            f"{_f(m['mean_c'].mean())}; the tests are in the table above and the claims below).")


def sentence_controls(control: pd.DataFrame, lag: pd.DataFrame, sync: pd.DataFrame,
                      passive: pd.DataFrame | None, published: dict,
                      shuffled: pd.DataFrame | None = None) -> str:
    """Passive and shuffled vs genuine per pair (None: the run lacks that condition), and
    the change from lag 0 to the largest lag."""
    if passive is None:
        s1 = "This run has no passive-reader condition (`simulate.passive` was off)."
    else:
        s1 = _versus(sync, passive, "the passive reader")
    if shuffled is not None:
        s1 += (" " + _versus(sync, shuffled, "the shuffled control (training targets permuted "
                             "within each dialog, the paper's code's control)"))
    kmax = int(lag["k"].max()) if len(lag) else 0
    if kmax > 0:
        k0 = lag[lag["k"] == 0]["mean"].mean()
        kk = lag[lag["k"] == kmax]["mean"].mean()
        word = "falls" if kk < k0 else "rises"
        s2 = f" From lag k = 0 to k = {kmax}, the mean SyncR² over pairs {word} from {_f(k0)} to {_f(kk)}."
    else:
        s2 = " This run has no lagged conditions."
    p = published["fig3_4"]
    return s1 + s2 + _paper(p, p["claim_passive"] + " " + p["claim_lag"])


# --------------------------------------------------------------------------- figure 5
def sentence_relationship(table: pd.DataFrame, published: dict, res=None) -> str:
    """Mean SyncR² per relationship, the test of closeness over the paper's five categories
    (:meth:`synclib.results.Results.relationship_closeness`), how family_member is treated,
    and how many scenarios each category comes from."""
    from synclib.scenarios import CLOSENESS_CODES, RELATIONSHIPS

    p = published["fig5"]
    if table.empty:
        return _empty("relationship analysis", "relationship_sync_r2") + _paper(p, p["claim"])
    means = table.groupby(["code", "relationship"])["sync"].agg(["mean", "count"]).reset_index()
    means = means.sort_values("code")
    parts = [f"{r.relationship} {_f(r['mean'])} (n = {r['count']})" for _, r in means.iterrows()]
    s = f"Mean SyncR² by relationship: {_join(parts)}."
    if res is not None:
        c = res.relationship_closeness(table)
        s += (f" Over the paper's five categories (appendix G names {', '.join(RELATIONSHIPS[k] for k in CLOSENESS_CODES)},"
              f" codes {CLOSENESS_CODES[0]}-{CLOSENESS_CODES[-1]}), closeness and the categories' mean SyncR² correlate "
              f"with {c.describe()}, one point per category.")
    outside = sorted(set(table.loc[~table["code"].isin(CLOSENESS_CODES), "relationship"]))
    if outside:
        s += (f" {_join(outside)} (Sotopia's code {', '.join(str(k) for k in RELATIONSHIPS if RELATIONSHIPS[k] in outside)}) "
              "is not among them: none of the paper's 450 tasks uses it and the paper never places it on its "
              "closeness scale, so it is drawn last and left out of the correlation.")
    if res is not None and (absent := sorted(set(res.relationship_scenarios(with_values=False)) - set(table["relationship"]))):
        s += (f" {_join(absent)} {'is' if len(absent) == 1 else 'are'} in this run's tasks but left out: too few of "
              "its test samples in every split.")
    if res is not None and (scen := res.relationship_scenarios()):
        s += (" Scenarios per category in this run's tasks: " + ", ".join(f"{k} {v}" for k, v in scen.items())
              + (". Where a category comes from one or two scenarios, relationship cannot be told apart from the "
                 "scenario itself." if min(scen.values()) < 3 else "."))
    if "n_test" in table and np.isfinite(table["n_test"]).any():
        per = table.groupby("pair")["n_test"].first()
        s += (f" Each value is SyncR² on a test subset of {_join([f'{v:.0f} ({k})' for k, v in per.items()])} "
              "samples per relationship (every relationship subsampled to the smallest one's count; n counts "
              "split seeds x subsamples x runs, which re-use the same dialogs). Chance is 0: a map no better "
              "than predicting the partner's mean state.")
    return s + _paper(p, p["claim"])


# --------------------------------------------------------------------------- figure 6
def readable(table: pd.DataFrame, digits: int = 3):
    """``table`` for a page: no row numbers, numbers to ``digits`` decimals, columns named
    ``p`` or ending in `` p`` as :func:`synclib.stats.format_p` writes p-values, missing
    values as a dash, text cells whole (pandas would cut them at 50 characters)."""
    import html

    from synclib.stats import format_p

    def cell(write):
        return lambda x: "–" if x is None or not np.isfinite(x) else write(x)

    fmt = {c: cell(lambda x: html.escape(format_p(x))) if c == "p" or str(c).endswith(" p")
           else cell(lambda x: f"{x:.{digits}f}")
           for c in table.columns if pd.api.types.is_float_dtype(table[c])}
    return table.style.hide(axis="index").format(fmt, na_rep="–", escape="html").set_table_attributes(
        'class="dataframe"')


def published_correlations(published: dict) -> pd.DataFrame:
    """Figure 6's published Pearson r per family as a table."""
    return pd.DataFrame(published["fig6"]["pearson"]).rename(columns={"r": "paper r",
                                                                      "p": "paper p"})


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
    return s + _paper(published["fig6"], pub + ".")


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


def sentence_table1(table: pd.DataFrame | None, ability_scores, published: dict,
                    abilities: pd.DataFrame | None = None) -> str:
    """Table 1, or a plain statement of what is missing: no ability CSV, or no scores in it
    for this run's models (``abilities``: :meth:`synclib.results.Results.ability_table`)."""
    p = published["table1"]
    pub = "; ".join(f"{d['family']} {d['ifeval']} / {d['musr']}" for d in p["partial_r"])
    pub = f"partial r given IFEval / MuSR: {pub}. {p['note']}"
    if table is None:
        return (f"No ability scores were given (`ability_scores = {ability_scores!r}`), so the "
                "partial correlations of table 1 are not computed here; pass a CSV with columns "
                "`model,ifeval,musr` to compute them." + _paper(p, pub))
    if abilities is not None and abilities[["ifeval", "musr"]].isna().all(axis=None):
        models = sorted(set(abilities["model_a"]) | set(abilities["model_b"]))
        return (f"`{ability_scores}` has no IFEval or MuSR scores for this run's models "
                f"({', '.join(models)}), so table 1 cannot be computed here; the shipped CSV holds "
                "the scores the paper's code used for its six models. Pass a CSV with columns "
                "`model,ifeval,musr` naming these models to compute it." + _paper(p, pub))
    parts = [f"{r['family']}: IFEval {r['ifeval note']}, MuSR {r['musr note']}"
             for _, r in table.iterrows()]
    return ("Partial correlation of SyncR² with social performance given ability, per model pair "
            "as the paper's code computes it (the first speaking order's social performance, the "
            "agent 1 -> agent 2 SyncR² of both orders) - " + "; ".join(parts) + "." + _paper(p, pub))


# --------------------------------------------------------------------------- figure 7
def sentence_topk(topk: pd.DataFrame, cors: pd.DataFrame, published: dict) -> str:
    """How top-k SyncR² changes with k, and the correlations that could be computed."""
    p = published["fig7"]
    if topk.empty:
        return _empty("top-k sensitivity analysis", "sync_r2_topk") + _paper(p, p["claim"])
    parts = []
    for pair, t in topk.groupby("pair", sort=False):
        t = t.sort_values("k")
        parts.append(f"{pair} from {_f(t['mean'].iloc[0])} (k = {int(t['k'].iloc[0])}) to {_f(t['mean'].iloc[-1])} "
                     f"(k = {int(t['k'].iloc[-1])}, all its partner's layers)")
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
    return s + _paper(p, p["claim"])


# --------------------------------------------------------------------------- figure 8
def sentence_clipping(table: pd.DataFrame, published: dict, res=None) -> str:
    """Effect of keeping negative R² on SyncR² and its standard error, at each penalty of
    ``table`` (:meth:`synclib.results.Results.clipping_table`): the paper's and the run's own."""
    p = published["fig8"]
    if table.empty:
        return _empty("unclipped SyncR²", "sync_r2_noclip") + _paper(p, p["claim"])
    from synclib.results import Results

    names = {"paper": "At the paper's penalty λ = 0.1 (the paper's setting)",
             "run": f"At this run's own penalty ({res.penalty_label() if res is not None else 'its own'})"}
    parts = []
    for penalty, t in table.groupby("penalty", sort=False):
        s = Results.clipping_summary(t)
        if not np.isfinite(s["clipped"]):
            continue
        parts.append(f"{names.get(penalty, penalty)}, keeping negative R² changes the mean SyncR² over "
                     f"{s['n_pairs']} pairs from {_f(s['clipped'])} to {_f(s['kept'])} and its standard error by a "
                     f"factor of {_f(s['se_ratio'], 1)} (median over pairs)"
                     + (": no source layer's best mean R² is negative there, so clipping changes nothing by "
                        "construction" if penalty == "run" and abs(s["kept"] - s["clipped"]) < 5e-4 else "") + ".")
    if not parts:
        return _empty("unclipped SyncR²", "sync_r2_noclip") + _paper(p, p["claim"])
    return " ".join(parts) + _paper(p, p["claim"])


# --------------------------------------------------------------------------- figure 9
def sentence_sample_size(table: pd.DataFrame, published: dict) -> str:
    """SyncR² at the smallest and largest training sizes, and the last step's gain."""
    p = published["fig9"]
    if table.empty:
        return _empty("sample-size analysis", "sample_size_sync_r2") + _paper(p, p["claim"])
    parts = []
    for pair, t in table.groupby("pair", sort=False):
        t = t.sort_values("n_samples")
        first, last = t.iloc[0], t.iloc[-1]
        full = " (the run's full size: the mean over its genuine datasets)" if last.get("point") == "full run" else ""
        part = (f"{pair} from {_f(first['mean'])} with {int(first['n_samples'])} samples per dataset to "
                f"{_f(last['mean'])} with {int(last['n_samples'])}{full}")
        if len(t) > 1:
            prev = t.iloc[-2]
            part += f" (the last step, from {int(prev['n_samples'])}, {last['mean'] - prev['mean']:+.3f})"
        parts.append(part)
    return "SyncR² goes, " + "; ".join(parts) + "." + _paper(p, p["claim"])


def sample_curve_markdown(curves: pd.DataFrame) -> str:
    """The measured sample-size curves (:func:`synclib.sizing.curve_table`) as a Markdown
    table per pair (SyncR² per condition and dataset size) and a sentence on where genuine
    SyncR² leaves 0; a note when there are none."""
    from synclib.sizing import LEAVES_ZERO

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


# --------------------------------------------------------------------------- tables 2, 5
def comparison_with_paper(ours: pd.DataFrame, entry: dict) -> pd.DataFrame:
    """Tables 2 / 5 in long form, ours and the paper's rows, for :func:`synclib.plots.comparison_bars`.

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
    """``label x setting`` table of ``mean ± se`` strings (for display)."""
    cell = long.assign(value=[f"{m:.2f} ± {s:.2f}" if np.isfinite(s) else f"{m:.2f}"
                              for m, s in zip(long["mean"], long["se"])])
    return cell.pivot(index="label", columns="setting", values="value").reindex(
        index=list(dict.fromkeys(long["label"])), columns=list(dict.fromkeys(long["setting"])))


def sentence_comparison(ours: pd.DataFrame, entry: dict, what: str, var: str,
                        quantity: str = "SyncR²") -> str:
    """Difference between the two settings, ours and the paper's.

    ``quantity`` names what our numbers are (e.g. when they are not a full SyncR²).
    """
    a, b = entry["settings"]
    pub = "; ".join(f"{r['pair']} {r[a][0]:.2f} / {r[b][0]:.2f}" for r in entry["rows"])
    pub = f"{a} / {b}: {pub}."
    if ours.empty:
        return _empty(what, var) + _paper(entry, pub)
    w = ours.pivot(index="pair", columns="setting", values="mean")
    d = (w[b] - w[a]).dropna()
    s = (f"{b.capitalize()} minus {a} {quantity} over our {len(d)} pairs: mean {d.mean():+.3f} "
         f"(from {d.min():+.3f} to {d.max():+.3f}); {int((d > 0).sum())} of {len(d)} pairs are "
         f"higher with the {b} setting.")
    return s + _paper(entry, pub)


# --------------------------------------------------------------------------- figure 11
def sentence_tom(table: pd.DataFrame, published: dict) -> str:
    """How many decoders beat the train-mean baseline."""
    p = published["fig11"]
    if table.empty:
        return _empty("Theory-of-Mind decoding", "tom_kl") + _paper(p, p["claim"])
    keys = ["pair", "target", "relation"]
    dec = table[table["decoder_or_baseline"] == "decoder"].set_index(keys)["mean"]
    base = table[table["decoder_or_baseline"] == "baseline"].set_index(keys)["mean"]
    both = pd.concat({"dec": dec, "base": base}, axis=1).dropna()
    if both.empty:
        return ("This run has decoders but no baseline KL to compare with."
                + _paper(p, p["claim"]))
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
              f"relation): {_join(per)}. Chance is the baseline: the training set's mean distribution, what a "
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
    return s + _paper(p, p["claim"])


def sentence_judged(table: pd.DataFrame, scores: pd.DataFrame | None = None) -> str:
    """How many dialogs of each ordered run were judged, what that says about its mean and, with
    the per-dialog ``scores`` (:meth:`synclib.results.Results.dialog_scores`), whether the runs
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


# --------------------------------------------------------------------------- the run summary
def _judge_line(judge: dict) -> str:
    """Which judge scored social performance, in which mode, on how many dialogs."""
    if not judge.get("model"):
        return "n/a"
    where = f"endpoint {judge['url']}" if judge.get("url") else "local model"
    mode = judge.get("mode") or ("json" if judge.get("url") else "constrained")
    how = {"constrained": "constrained scoring (score read from the judge's distribution over "
                          "the allowed integers, one agent and dimension at a time)",
           "json": "JSON mode (the judge writes the whole evaluation)"}.get(mode, mode)
    n = judge.get("sample")
    scope = (f"a random sample of {n} dialogs per ordered run (sample seed {judge.get('sample_seed', 0)})"
             if n else "every dialog")
    return f"`{judge['model']}` ({where}), {how}; {scope}"


def sample_counts_text(res) -> str:
    """The run's dataset sizes from :meth:`synclib.results.Results.sample_counts` (the one count):
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
    parts = [f"{_join(conds)} {tr} for training and {te} for testing" for (tr, te), conds in groups.items()]
    return ("Samples per dataset, as the analysis split them (the range over ordered runs, directions and "
            "split seeds): " + "; ".join(parts) + ".")


def _size_lines(res) -> list[str]:
    """Why the run has the size it has: its training samples against the measured curves."""
    from synclib import power
    from synclib.sizing import clip_size, leaves_zero_text, load_curves

    counts = res.sample_counts()
    gen = counts[counts["condition"] == "genuine"]["n_train"]
    dims = power.run_sample_sizes(res).get("dims") or []
    got = clip_size(max(dims), load_curves()) if len(gen) and dims else None
    if got is None:
        return ["", sample_counts_text(res)] if len(gen) else []
    n, how = got
    verdict = "above" if gen.min() > n else "below"
    measured = any(c.width == max(dims) for c in load_curves())  # else the point is scaled: say how
    return ["", f"**The run's size.** SyncR² clips each layer's test R² at 0, so with too few training samples "
            f"it is 0 whatever the models do. {leaves_zero_text()} For models {max(dims)} wide that point is about "
            f"{n:.0f}{'' if measured else f' ({how})'}; every genuine dataset of this run has {int(gen.min())} or "
            f"more, {verdict} it. "
            f"{sample_counts_text(res)} `synclib run --dry-run` prints every dataset's count before a run (an upper "
            "bound: dialogs that end early give fewer) and warns below the curve."]


def embedded_run_markdown(res) -> str:
    """Markdown for ``book/_generated/embedded_run.md``: what the run being read has, for the
    *embedded models* page (everything there that depends on the run comes from here)."""
    from synclib.sizing import leaves_zero_text

    cfg = res.config
    sim = cfg.get("simulate") or {}
    counts = res.sample_counts()
    lines = [f"**This run** (`{res.manifest.get('name', 'unnamed')}`"
             + (", the embedded tiny models" if res.embedded else ", not the embedded models") + f"): "
             f"{len(res.pair_names)} model pair{'s' if len(res.pair_names) != 1 else ''} "
             f"({', '.join(res.pair_names)}; ordered runs {', '.join(res.run_names)}), "
             f"{sim.get('episodes', '?')} tasks x {len(sim.get('seeds') or [0])} simulation seed(s), at most "
             f"{sim.get('max_utterances', '?')} utterances per dialog.", ""]
    if len(counts):
        lines += [sample_counts_text(res) + " " + leaves_zero_text(), ""]
    n_pairs = len(res.pair_names)
    lines += [f"- **Social performance (figure 6, table 1, figure 7).** {n_pairs} model pair"
              f"{'s' if n_pairs != 1 else ''}: a correlation across pairs needs at least {stats.MIN_N_CORR} "
              "(and many more to be evidence); the pages say so instead of printing an r."]
    judged = res.judged_table()
    if len(judged):
        lines += [f"- **The judge.** {_join([f'{r.judged} of {int(r.dialogs) if np.isfinite(r.dialogs) else chr(63)} dialogs of {r.run}' for r in judged.itertuples()])} "
                  "were judged (figure 6 gives each run's interval)."]
    scen = res.relationship_scenarios() if res.runs_with("relationship_sync_r2") else {}
    if scen:
        lines += ["- **Relationships (figure 5).** Scenarios per category among the everyday-encounter sources: "
                  + ", ".join(f"{k} {v}" for k, v in scen.items())
                  + (": a category from one or two scenarios cannot be told apart from its scenario."
                     if min(scen.values()) < 3 else ".")]
    tom = res.tom_table()
    if len(tom):
        dec = tom[tom["decoder_or_baseline"] == "decoder"]
        kept, dropped = int(dec["n_kept"].sum()), int(dec["n_dropped"].sum())
        if kept + dropped:
            lines += [f"- **Theory of Mind (figure 11).** {kept} of {kept + dropped} decoded samples' replies followed "
                      "the instructed \"Emotion. Action type.\" format; the format filter was "
                      + ("on: only those are decoded." if bool(dec["filtered"].all()) else
                         "off (`analysis.tom_format_filter: false`): every reply is decoded, which the paper does not do.")]
    return "\n".join(lines) + "\n"


def _penalty_cell(alpha) -> str:
    """The run summary's ridge penalty, with the paper's beside it."""
    if alpha == "cv":
        return ("chosen per source layer by cross-validation over whole episodes (the paper: 0.1; figure 8 also "
                "refits at 0.1)")
    return "n/a" if alpha is None else f"{alpha}" + (" (the paper's)" if alpha == 0.1 else " (the paper: 0.1)")


def run_summary_markdown(res) -> str:
    """Markdown for ``book/_generated/run_summary.md``: models, sizes and the headline numbers.

    Parameters
    ----------
    res : synclib.results.Results
    """
    cfg = res.config
    sim = cfg.get("simulate") or {}
    ana = cfg.get("analysis") or {}
    lines = [banner(res).strip()] if res.synthetic else []
    models = {}
    for p in res.runs:
        models.setdefault(p.model_a, None)
        models.setdefault(p.model_b, None)
    episodes = sim.get("episodes")
    if isinstance(episodes, list):
        episodes = f"{len(episodes)} listed"
    lines += [
        f"**Run `{res.manifest.get('name', 'unnamed')}`** "
        f"({'embedded tiny models' if res.embedded else 'configured models'}"
        f"{', created ' + res.manifest['created'] if res.manifest.get('created') else ''}).",
        "",
        "| setting | value |", "| --- | --- |",
        f"| models | {', '.join(models)} |",
        f"| pairs | {', '.join(res.pair_names)} |",
        f"| ordered runs | {', '.join(res.run_names)} (speaking orders: {res.orders_played()}) |",
        f"| scenarios | {cfg.get('scenarios', 'n/a')} |",
        f"| tasks (episodes) | {episodes if episodes is not None else 'n/a'} |",
        f"| simulation seeds | {sim.get('seeds', 'n/a')} |",
        f"| max utterances | {sim.get('max_utterances', 'n/a')} |",
        f"| max new tokens | {sim.get('max_new_tokens', 'n/a')} |",
        f"| judge | {_judge_line(cfg.get('judge') or {})} |",
        f"| ridge λ | {_penalty_cell(ana.get('alpha'))} |",
        f"| split seeds | {ana.get('split_seeds', 'n/a')} |",
    ]
    sync = res.sync_table()
    conds = res.conditions()
    passive = res.sync_table("passive") if "passive" in conds else None
    counts = res.sample_counts()
    gen = counts[counts["condition"] == "genuine"]["n_train"]
    if len(gen):
        lo, hi = int(gen.min()), int(gen.max())
        lines.append(f"| training samples per genuine dataset | {lo}-{hi} |" if lo != hi else
                     f"| training samples per genuine dataset | {lo} |")
    lines += _size_lines(res)
    models = res.model_table()
    if len(models):
        lines += ["", "**Table 3** (the paper's appendix F: abbreviations and full model names), for this run's "
                  "models; layers and width as the cubes record them:", "",
                  "| abbreviation | model | spec | family | layers | width |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r.abbreviation} | {r.model} | `{r.spec}` | {r.family} | "
                  f"{'—' if not np.isfinite(r.layers) else int(r.layers)} | "
                  f"{'—' if not np.isfinite(r.width) else int(r.width)} |" for r in models.itertuples()]
    lines += ["", "**Headline numbers of this run** (per model pair: the mean of its directional SyncR² "
              "values, both directions of every speaking order played, ± the mean of their standard "
              "errors over split seeds, as the paper's code computes them):", ""]
    for _, r in sync.iterrows():
        extra = ""
        if passive is not None:
            pr = passive.set_index("pair").loc[r["pair"]]
            extra = f"; passive reader {_f(pr['mean'])} ± {_f(pr['se'])}"
        lines.append(f"- {r['pair']} ({r['model_a']} & {r['model_b']}): SyncR² "
                     f"{_f(r['mean'])} ± {_f(r['se'])}{extra}")
    from synclib.claims import claims_summary
    from synclib.results import load_published

    lines += ["", "**Every claim of the paper, and whether this run can speak to it** (each figure's page "
              "repeats its line; the argument behind the controls' tests is on the page *Statistical power*):", ""]
    lines += [f"- {s}" for s in claims_summary(res, load_published())]
    return "\n".join(lines) + "\n"


def _num(x, digits=3):
    return "n/a" if x is None else (f"{x:.{digits}g}" if isinstance(x, float) else str(x))


def _gpu_name(r) -> str:
    m = r.get("machine") or r.get("env") or {}
    return m.get("gpu", "a GPU")


def _gpu_ridge_lines(g) -> list[str]:
    out = ["**Paper scale on a GPU** (6,500 samples, 32 x 32 layers, 4096 wide, 3 split seeds, one direction, "
           "`python bench/bench_ridge.py --paper-scale`):", ""]
    if not g:
        return out + ["not measured yet.", ""]
    out += [f"{_gpu_name(g)}, torch {g['env'].get('torch', '?')}, measured {g.get('date', '?')}.", "",
            "| precision | 3 seeds, seconds | largest difference from the per-pair solve |",
            "| --- | --- | --- |"]
    for prec in ("float32", "tf32", "bf16"):
        if f"ours_{prec}_3_seeds_s" in g:
            out.append(f"| batched, {prec} | {_num(g[f'ours_{prec}_3_seeds_s'])} | "
                       f"{_num(g[f'max_abs_diff_{prec}_vs_baseline'])} |")
    key = next(k for k in g if k.startswith("baseline_3_seeds_s"))
    out += [f"| the paper's per-pair solve, float32{' (one seed run, times 3)' if 'extrap' in key else ''} | "
            f"{_num(g[key])} | — |", ""]
    return out


def _gpu_ridge_solve_lines(g) -> list[str]:
    """Where the paper-scale grid's time goes on a GPU, and what the smaller-side solve bought."""
    if not g:
        return []
    st, ms = g["stages_one_seed"], g["micro_ms"]
    out = [f"{_gpu_name(g)}, torch {g['env'].get('torch', '?')}, measured {g.get('date', '?')[:10]} "
           "(`bench/results/ridge_paper_cuda_h200.json`): the same grids after the hat matrices' triangular "
           "solves took the 1,300 test rows as right-hand sides instead of the 5,200 training rows "
           "(identical grids: the float64 difference vanishes in the float32 cast).", "",
           "| precision | 3 seeds, seconds | source side, one seed | scoring, one seed | "
           "largest difference from the float64 solve |", "| --- | --- | --- | --- | --- |"]
    for prec in ("float32", "tf32", "bf16"):
        if f"ours_{prec}_3_seeds_s" in g:
            out.append(f"| {prec} | {_num(g[f'ours_{prec}_3_seeds_s'])} | {_num(st[prec]['source_side_s'])} | "
                       f"{_num(st[prec]['scoring_s'])} | {_num(g[f'max_abs_diff_{prec}_vs_float64_reference'])} |")
    out += [f"| {g['old_hat_precision']}, the solves as before (same run) | {_num(g['old_hat_3_seeds_s'])} | | | |", "",
            f"The faster precisions now spend most of their time in the float64 source side: per source layer "
            f"{_num(ms['gram_XcT_Xc_float64'])} ms for `Xc'Xc`, {_num(ms['cholesky_float64'])} ms for the Cholesky "
            f"factorisation, {_num(ms['solve_rhs_n_test_float64'])} ms for the triangular solves and "
            f"{_num(ms['hat_gemm_float64'])} ms for the hat product. float32 does not make them cheaper on "
            f"this card ({_num(ms['gram_XcT_Xc_float32'])}, {_num(ms['cholesky_float32'])} and "
            f"{_num(ms['solve_rhs_n_test_float32'])} ms: its float64 tensor cores run at the float32 rate), so a "
            "float32 factorisation with a step of refinement would add its refinement's products to the same "
            f"cost; batching 8 factorisations took {_num(ms['cholesky_float64_batch_of_8'])} ms against "
            f"{_num(ms['cholesky_float64_8_one_at_a_time'])} ms one at a time, and two `solve_triangular` calls "
            f"{_num(ms['solve_rhs_n_test_float64_two_trsm'])} ms against {_num(ms['solve_rhs_n_test_float64'])} "
            "ms for `cholesky_solve`. Under 1 s for the three seeds is not reached; what is left to try: "
            "`X'X` of all 6,500 rows once per layer, each seed's training Gram matrix as that minus its test "
            "rows' (a quarter of the product), and the TF32 hat product.", ""]
    return out


def _stream_step_sentence(p) -> str:
    """What one slot step costs against the batch decoder's step (``bench/profile_stream.py``)."""
    if not p:
        return ""
    runs = p["runs"]
    per = ", ".join(f"{_num(r['stream']['step_ms'])} against {_num(r['generate']['step_ms'])} ms with {n} rows"
                    for n, r in runs.items())
    return (f"One slot step ({p['capacity']} slots, `bench/profile_stream.py`, {p['prompt_tokens']}-token prompts) "
            f"costs about what the batch decoder's step costs ({per}), so the time goes outside the decoding "
            "steps: the joins' small prefills, the copies into the slots, the ToM read-outs and host work. ")


def _gpu_scheduling_lines(c, p=None) -> list[str]:
    """The dialog loop turn by turn against continuous batching at the 7B shape on a GPU, and
    the profile of one slot step ``p``."""
    if not c:
        return []
    r, s = c["results"]["mistral7b"], c["settings"]
    t, k = r["modes"]["turns"], r["modes"]["continuous"]
    out = [f"**At the Mistral-7B shape on {_gpu_name(c)}** (random weights, bf16, {s['tasks']} embedded tasks x 1 "
           f"seed, {s['max_utterances']} utterances, replies up to {s['max_new_tokens']} tokens, batch "
           f"{s['batch_size']}, passive reader and ToM dialogs; CUDA-graph decoding, the default on CUDA, whose "
           f"stream capture passed `tests/test_engine_cuda.py` in the same call; measured "
           f"{c['date']}, `bench/results/scheduling_cuda.json`):", "",
           "| scheduling | s | utterances/s | steps | rows / step | reused |", "| --- | --- | --- | --- | --- | --- |"]
    for mode, v in (("turns", t), ("continuous", k)):
        out.append(f"| {mode} | {_num(v['wall_s'])} | {_num(v['utterances_per_s'])} | {v['decode_steps']} | "
                   f"{_num(v['rows_per_step'])} | {100 * v['reused_share_of_prompt_tokens']:.1f} % |")
    out += ["", f"Continuous batching needed {100 * (1 - k['decode_steps'] / t['decode_steps']):.0f} % fewer "
            f"decoding steps but took only {100 * (1 - k['wall_s'] / t['wall_s']):.0f} % less time. "
            f"{_stream_step_sentence(p)}Far from the 40 utterances/s that issue 39 asks for. {c.get('note', '')}", ""]
    return out


def _gpu_engine_lines(s, loop, modes=None, dialog=None) -> list[str]:
    out = ["**A Mistral-7B-shaped model on a GPU** (random weights built from the config, "
           "`python bench/bench_simulate.py --device cuda`):", ""]
    if not s:
        return out + ["not measured yet.", ""]
    rows = []
    for dt, runs in s["engine"].items():
        for r in runs:
            rows.append((dt, "synclib engine" + (f", {r['decode']} decoding" if "decode" in r else ""), r))
    for dt, runs in s.get("hf_generate", {}).items():
        for r in runs:
            rows.append((dt, "transformers generate + hooks", r))
    first = next(iter(s["engine"].values()))[0]
    out += [f"{_gpu_name(s)}; prompts of {first['prompt_tokens']} tokens, {first['new_tokens']} new tokens, "
            f"no KV reuse (measured {s.get('date', s['machine'].get('date', 'in the first GPU session'))}).", "",
            "| dtype | method | batch | utterances/s | decoding step (ms) |", "| --- | --- | --- | --- | --- |"]
    for dt, what, r in rows:
        out.append(f"| {dt} | {what} | {r['batch_size']} | {_num(r.get('utterances_per_s'))} | "
                   f"{_num(r.get('decode_step_ms'))} |")
    out.append("")
    if loop:
        steps = ", ".join(f"{_num(r.get('decode_step_ms'))} ms at batch {r['batch_size']}" for r in loop["engine"]["bfloat16"])
        out += [f"After the decoding loop moved sampling and stop checks onto the device: {steps} "
                "(`engine_cuda_decode_loop.json`): no gain; the step was host-bound for another reason "
                "(see `bench/gpu_notes.md`).", ""]
    if modes:
        out += ["The decoding step as CUDA graphs over a preallocated cache (`Engine(decode=\"graph\")`, "
                "the default on CUDA), against the growing cache, same run (`engine_cuda_decode_modes.json`):", "",
                "| batch | decoding | utterances/s | decoding step (ms) | prefill tokens/s |",
                "| --- | --- | --- | --- | --- |"]
        for r in next(iter(modes["engine"].values())):
            out.append(f"| {r['batch_size']} | {r['decode']} | {_num(r['utterances_per_s'])} | "
                       f"{_num(r['decode_step_ms'])} | {_num(r['prefill_tokens_per_s'])} |")
        out.append("")
    d = s.get("simulate")
    if d and not dialog:
        out += [f"The dialog loop ({d['episodes']} tasks x {len(d['seeds'])} seeds, batch {d['batch_size']}, "
                f"{d['max_utterances']} utterances, replies ending at their first line break, at most "
                f"{d['new_tokens']} tokens): **{_num(d['utterances_per_s'])} utterances/s** in {d.get('dtype', 'bf16')} "
                "(the goal is 40).", ""]
    if dialog:
        d0 = dialog["steps"][0]["simulate"]
        out += [f"The dialog loop ({d0['episodes']} tasks x {len(d0['seeds'])} seeds, batch {d0['batch_size']}, "
                f"{d0['max_utterances']} utterances, replies ending at their first line break, at most "
                f"{d0['new_tokens']} tokens; `dialog_loop_cuda_mistral7b.json`), one engine change per row; "
                f"the first GPU session's dynamic decoding gave {_num(d['utterances_per_s']) if d else '?'} "
                "utterances/s:", "",
                "| engine | utterances/s | prompt tokens reused | decoding steps |", "| --- | --- | --- | --- |"]
        for st in dialog["steps"]:
            m = st["simulate"]
            out.append(f"| {st['label']} | {_num(m['utterances_per_s'])} | {st['prefix_reuse']:.0%} | "
                       f"{m['engine_stats'].get('graph_steps', '?')} |")
        out += ["", "The goal is 40 utterances/s. What bounds the loop now is the turn: every row of a batch "
                "decodes until the batch's longest reply ends (about 275 steps a turn against replies of "
                "about 64 tokens), which continuous batching of dialogs removes.", ""]
    diff = s.get("state_difference_vs_first_dtype", {}).get("bfloat16")
    if diff:
        out += [f"bf16 against float32 on the same random weights: mean relative L2 difference of the hidden "
                f"states {_num(diff['relative_l2_mean'])} (largest layer {_num(diff['relative_l2_max_layer'])}), "
                f"lowest cosine {_num(diff['cosine_min'])}, over {diff['rows']} prompts. Random networks amplify "
                "rounding layer by layer; this says nothing about trained models.", ""]
    return out


def _gpu_e2e_lines(e) -> list[str]:
    out = ["**`synclib run` end to end on a GPU** (`python bench/bench_e2e.py --device cuda --book`):", ""]
    if not e:
        return out + ["not measured yet.", ""]
    st = e["settings"]
    out += [f"{_gpu_name(e)}: two random Mistral-7B-shaped models, {st['tasks']} tasks, both orders, "
            f"{st['max_utterances']} utterances, {st['max_new_tokens']} new tokens, passive and ToM passes."]
    if e.get("status"):
        out += [f"*{e['status']}.*"]
    if e.get("engine_note"):
        out += [f"*Engine: {e['engine_note']}.*"]
    jobs = e.get("jobs_finished") or e.get("jobs") or {}
    out += ["", "| job | seconds | peak GPU memory (GiB) | prompt tokens reused |", "| --- | --- | --- | --- |"]
    for k, v in jobs.items():
        reuse = f"{v['prefix_reuse']:.0%}" if "prefix_reuse" in v else "—"
        out.append(f"| {k} | {_num(v.get('seconds'))} | {_num(v.get('peak_gpu_gib'))} | {reuse} |")
    if e.get("followup", {}).get("notebooks_and_book_s"):
        out.append(f"| notebooks and book (re-run) | {_num(e['followup']['notebooks_and_book_s'])} | — | — |")
    p = e.get("projection_from_finished_order") or e.get("projection") or {}
    if p:
        out += ["", f"Projected simulation time of the paper's grid ({p['paper_grid_episodes']:,} episodes) at this "
                f"rate: **{_num(p['paper_grid_simulate_gpu_hours'])} GPU-hours** (the goal is 24)."]
    return out + [""]


def main_job_lines(m: dict | None) -> list[str]:
    """The benchmarks page's section on the measured main job (``bench/bench_main_job.py``):
    each job kind's seconds and peak resident memory, the rates the dry run scales."""
    out = ["## The main job on the CPU (`bench/bench_main_job.py`)", ""]
    if not m:
        return out + ["*No result yet: run `make book`, then `python bench/bench_main_job.py`.*", ""]
    mc, j = m["machine"], m["jobs"]
    out += [f"`make book` with `config/default.yaml` on {mc['cpu_count']} cores of {mc['cpu']} "
            f"({m['dtype_used']}, torch {mc['torch']}, measured {m['date']}): the pipeline's jobs took "
            f"{_num(m['pipeline_seconds'] / 60)} minutes"
            + (f", the whole `make book` {_num(m['make_book_wall_s'] / 60)} minutes" if m.get("make_book_wall_s") else "")
            + (f" with a peak resident memory of {_num(m['make_book_peak_rss_gib'])} GiB"
               if m.get("make_book_peak_rss_gib") else "")
            + ". `synclib run --dry-run` scales these rates to another configuration.", "",
            "| job | seconds | peak resident memory (GiB) | rate |", "| --- | --- | --- | --- |"]
    for name, v in j["simulate"].items():
        out.append(f"| simulate {name} | {_num(v['seconds'])} | {_num(v['peak_rss_gib'])} | "
                   f"{_num(1 / v['seconds_per_utterance'])} utterances/s of {v['planned_utterances']:,} planned |")
    for name, v in j["judge"].items():
        out.append(f"| judge {name} | {_num(v['seconds'])} | {_num(v['peak_rss_gib'])} | "
                   f"{_num(v['seconds_per_dialog'])} s per dialog |")
    for name, v in j["analyze"].items():
        out.append(f"| analyse {name} | {_num(v['seconds'])} | {_num(v['peak_rss_gib'])} | "
                   f"{v['dialogs']} dialogs, {v['split_seeds']} split seeds |")
    nb = j.get("notebooks", {})
    if nb:
        k = m.get("notebooks_at_once", 1)
        out.append(f"| {len(nb)} notebooks{f', {k} at a time' if k > 1 else ''} | "
                   f"{_num(sum(v['seconds'] for v in nb.values()) / k)} | | |")
    for k in ("pages", "book"):
        if k in j:
            out.append(f"| {k} | {_num(j[k]['seconds'])} | | |")
    d = m.get("dtypes")
    if d:
        out += ["", f"The same simulation ({d['pair']}, {d['tasks']} tasks, with the passive reader) took "
                f"{_num(d['seconds']['bfloat16'])} s in bfloat16 and {_num(d['seconds']['float32'])} s in "
                f"float32 on this machine: float32 is {_num(d['float32_factor'])}x slower, the factor the dry "
                "run applies to the simulation and judging on a CPU without native bfloat16."]
    return out + [""]


def benchmarks_markdown(bench_dir) -> str:
    """Markdown for ``book/_generated/benchmarks.md``, quoting ``bench/results/*.json``.

    Every number comes from a JSON file written by a script in ``bench/``; files that
    are missing are said to be missing (e.g. GPU benchmarks not yet run).
    """
    import json
    from pathlib import Path

    bench_dir = Path(bench_dir)

    def load(name):
        f = bench_dir / name
        return json.loads(f.read_text()) if f.is_file() else None

    out = []
    r = load("ridge_embedded_cpu.json")
    out += ["## Batched ridge (`bench/bench_ridge.py`)", ""]
    if r:
        env = r.get("env", {})
        out += [
            f"CPU ({env.get('cpu_count', '?')} cores, torch {env.get('torch', '?')}, measured "
            f"{r.get('date', '?')}), embedded scale: {r['n_samples']} samples, {r['layers']} layers x "
            f"{r['width']} wide, λ = {r['alpha']}.", "",
            "| | seconds |", "| --- | --- |",
            f"| batched grid (ours), one grid | {_num(r['ours_per_grid_s'])} |",
            f"| the paper's method (one solve per layer pair), one grid | {_num(r['baseline_per_grid_s'])} |",
            f"| ours, both directions x {len(r['split_seeds'])} split seeds | {_num(r['ours_full_two_direction_3_seeds_s'])} |",
            "",
            f"Speed-up {_num(r['speedup_per_grid'])}x; largest difference from the per-pair baseline "
            f"{_num(r['max_abs_diff_vs_baseline'])} in R² (float32).", ""]
    else:
        out += ["*No result yet: run `python bench/bench_ridge.py`.*", ""]
    out += _gpu_ridge_lines(load("ridge_paper_cuda.json"))
    out += _gpu_ridge_solve_lines(load("ridge_paper_cuda_h200.json"))
    e = load("engine_cpu.json")
    out += ["## Hooked generation (`bench/bench_engine.py`)", ""]
    if e:
        s = e["settings"]
        out += [f"CPU, {e['model']}, {s['episodes']} tasks x {s['utterances_per_episode']} utterances, "
                f"{s['max_new_tokens']} new tokens, prompts of {s['mean_prompt_tokens']:.0f} tokens on average, "
                f"{e['torch_threads']} torch thread(s).", "",
                "| mode | batch | KV reuse | utterances/s | prompt tokens prefilled |",
                "| --- | --- | --- | --- | --- |"]
        for name, m in e["modes"].items():
            out.append(f"| {name} | {m['batch_size']} | {'yes' if m['kv_reuse'] else 'no'} | "
                       f"{_num(m['utterances_per_s'])} | {m['prefill_tokens']} |")
        out += ["", f"Loading SmolLM2 from synclib's de-quantised cache: {_num(e.get('load_from_cache_s'))} s "
                f"(plus {_num(e.get('import_torch_transformers_s'))} s to import torch and transformers).", ""]
    else:
        out += ["*No result yet: run `python bench/bench_engine.py`.*", ""]
    out += _candidate_lines(load("candidates_cpu.json"))
    out += _scheduling_lines(load("scheduling_cpu.json"))
    out += _gpu_scheduling_lines(load("scheduling_cuda.json"), load("profile_stream_cuda.json"))
    out += _gpu_engine_lines(load("simulate_cuda_mistral7b.json"), load("engine_cuda_decode_loop.json"),
                             load("engine_cuda_decode_modes.json"), load("dialog_loop_cuda_mistral7b.json"))
    out += _gpu_e2e_lines(load("e2e_cuda_mistral7b.json"))
    out += main_job_lines(load("main_job_cpu.json"))
    c = load("cube_storage_smollm2.json")
    out += ["## Cube storage (`bench/bench_simulate.py`)", ""]
    if c:
        out += [f"{c['values']:,} real SmolLM2 hidden-state values ({c['n_tasks']} tasks), zlib-compressed netCDF4:", "",
                "| store dtype | bytes per value | max relative error | mean relative error |",
                "| --- | --- | --- | --- |"]
        for k, v in c["store"].items():
            out.append(f"| {k} | {_num(v['bytes_per_value'])} | {_num(v['max_relative_error'])} | "
                       f"{_num(v['mean_relative_error'])} |")
        out.append("")
    a = load("analysis_stream_cpu.json")
    out += ["## Analysis streamed from disk (`bench/bench_analysis.py`)", ""]
    if a:
        sh, m = a["shape"], a["analysis"]
        out += [
            f"A cube of the paper's shape ({sh['episodes']} tasks x {sh['seeds']} seeds x {sh['rounds']} rounds, "
            f"two agents of {sh['layers']} layers x {sh['dim']}, float32, synthetic states) written through "
            f"`CubeWriter` in {_num(a['write_parts_s'])} s of parts plus {_num(a['finalize_s'])} s to finalise; "
            f"{_num(a['cube_file_gib'])} GiB on disk, {_num(a['hidden_variable_gib_in_memory'])} GiB per "
            "hidden-state variable in memory.", "",
            f"Then, in a fresh process on {a['machine']['cpu_count']} CPU cores: {a['what']}. The "
            f"finiteness mask took {_num(m['mask_seconds'])} s (one streamed pass over a variable) and the fit "
            f"{_num(m['analyze_seconds'])} s ({m['n_train']:,} training and {m['n_test']:,} test samples). The "
            f"rows of the split, {_num(a['samples_read_per_fit_gib'])} GiB for both sides, are the only hidden "
            "states held; the rest is the ridge's workspace (the per-source-layer Gram matrices of the "
            f"training rows alone are {_num(4 * sh['layers'] * m['n_train'] ** 2 / 2**30)} GiB). "
            f"**Peak resident memory: {_num(m['peak_rss_gib'])} GiB**; loaded whole, the two variables "
            f"alone would take {_num(2 * a['hidden_variable_gib_in_memory'])} GiB.", ""]
    else:
        out += ["*No result yet: run `python bench/bench_analysis.py`.*", ""]
    out += _dtype_lines(load("simulate_cpu_dtypes.json"))
    return "\n".join(out) + "\n"


def _candidate_lines(c) -> list[str]:
    """Candidate scoring, prefix tree against per-prefix cache copies (``bench/bench_candidates.py``)."""
    out = ["## Scoring candidate words and answers (`bench/bench_candidates.py`)", ""]
    if not c:
        return out + ["*No result yet: run `python bench/bench_candidates.py`.*", ""]
    m, j = c["machine"], c["constrained_judge"]
    out += [f"CPU ({m['cpu_count']} cores, torch {m['torch']}, measured {c['date']}). The ToM read-out and the "
            "constrained judge score given token sequences after a prompt. synclib feeds each row's candidates "
            "as one prefix tree in one forward pass per batch of rows; the fallback (for attention "
            "implementations that take no explicit mask) feeds each distinct prefix over its own copy of the "
            "row's key/value cache. Same prompts, same run:", "",
            "| workload | prefix tree, s | per prefix, s | speed-up | largest difference |",
            "| --- | --- | --- | --- | --- |"]
    for t in c["tom_emotions"]:
        out.append(f"| ToM emotion words, {t['model']}, {t['prompts']} prompts of {t['mean_prompt_tokens']:.0f} "
                   f"tokens | {_num(t['paths']['prefix_tree']['seconds'])} | {_num(t['paths']['per_prefix']['seconds'])} "
                   f"| {_num(t['speedup'])}x | {_num(t['max_abs_difference'])} (probability) |")
    out += [f"| constrained judge, {j['judge']}, {j['dialogs']} dialogs ({j['scores']} scores) | "
            f"{_num(j['paths']['prefix_tree']['seconds'])} | {_num(j['paths']['per_prefix']['seconds'])} | "
            f"{_num(j['speedup'])}x | {_num(j['max_abs_difference_expected_score'])} (expected score; "
            f"{'same' if j['same_scores'] else 'different'} scores) |", ""]
    return out


def _scheduling_lines(c) -> list[str]:
    """The dialog loop turn by turn against continuous batching (``bench/bench_scheduling.py``)."""
    out = ["## Continuous batching of dialogs (`bench/bench_scheduling.py`)", ""]
    if not c:
        return out + ["*No result yet: run `python bench/bench_scheduling.py`.*", ""]
    s, m = c["settings"], c["machine"]
    out += [f"CPU ({m.get('cpu_count', '?')} cores, torch {m.get('torch', '?')}, measured {c['date']}). The same "
            f"simulation ({s['tasks']} embedded tasks x 1 seed, {s['max_utterances']} utterances, "
            f"{s['max_new_tokens']} new tokens, batch {s['batch_size']}, passive reader and ToM dialogs) with "
            "`scheduling: turns` (each utterance index is one generate call: every dialog waits for the "
            "batch's longest reply) and `scheduling: continuous` (a dialog's next utterance joins the running "
            "batch as soon as its reply ends). Steps are decoding steps; rows / step is the decoding batch's "
            "occupancy; useful prefill is prefilled tokens over the token positions computed with left "
            "padding; reused is the share of prompt tokens taken from session caches.", "",
            "| model, scheduling | s | steps | rows / step | useful prefill | reused |",
            "| --- | --- | --- | --- | --- | --- |"]
    for preset, r in c["results"].items():
        label = f"{preset} ({r['model'].get('dtype', '?').replace('torch.', '')})"
        for mode, v in r["modes"].items():
            out.append(f"| {label}, {mode} | {_num(v['wall_s'])} | {v['decode_steps']} | "
                       f"{_num(v['rows_per_step'])} | {100 * v['prefill_useful_share']:.1f} % | "
                       f"{100 * v['reused_share_of_prompt_tokens']:.1f} % |")
    out.append("")
    for preset, r in c["results"].items():
        a, h = r["agreement"], r.get("agreement_turns_half_batch")
        t, k = r["modes"]["turns"], r["modes"]["continuous"]
        def more_or_less(ratio):
            return f"{abs(100 * (ratio - 1)):.0f} % {'more' if ratio > 1 else 'less'}"

        line = (f"- **{preset}**: continuous batching took {more_or_less(1 / r['speedup'])} time with "
                f"{abs(100 * (k['decode_steps'] / t['decode_steps'] - 1)):.0f} % "
                f"{'more' if k['decode_steps'] > t['decode_steps'] else 'fewer'} decoding steps; identical texts "
                f"{100 * a['identical_text_share']:.1f} %, largest state difference {_num(a['max_abs_diff_hidden'])}")
        if h:
            line += (f". For reference, turn by turn at half the batch size against the full batch: identical "
                     f"texts {100 * h['identical_text_share']:.1f} %, largest state difference "
                     f"{_num(h['max_abs_diff_hidden'])}")
        out.append(line + ".")
    out += ["", "On the CPU a decoding step costs about as much per row whatever the batch, so fewer steps "
            "with more rows in each save little, and each join's prefill and cache merge cost something: "
            "`scheduling: turns` stays the default. On a GPU a step costs about the same for 1 or 128 rows, "
            "which is where fewer steps count; measuring that, and CUDA graphs for a batch whose rows change "
            "at every step, is the device part of issue 25. Where texts differ, a sampled token moved at float "
            "rounding and the dialog went its own way from there: in bfloat16 the rows that share a batch "
            "already change the rounding (the reference line above), and a random model's nearly flat "
            "distribution over 32,000 tokens turns the smallest difference into another token. In float32 "
            "`tests/test_simulate.py` finds the two schedulings' cubes equal to float rounding.", ""]
    return out


def _dtype_lines(d) -> list[str]:
    """bf16 against float32 hidden states on the CPU (``bench/bench_simulate.py --dtype float32,bfloat16``)."""
    out = ["## bf16 against float32 hidden states on the CPU (`bench/bench_simulate.py`)", ""]
    diff = (d or {}).get("state_difference_vs_first_dtype", {}).get("bfloat16")
    if not diff:
        return out + ["*No result yet: run `python bench/bench_simulate.py --device cpu --preset tiny "
                      "--dtype float32,bfloat16`.*", ""]
    m, mach = d.get("model", {}), d.get("machine", {})
    return out + [
        f"A config-built Llama ({m.get('n_layers', '?')} layers x {m.get('d_model', '?')}, random weights) "
        f"on {mach.get('cpu_count', '?')} CPU cores, torch {mach.get('torch', '?')}: the last-prompt-token "
        f"states of {diff['rows']} prompts in bfloat16 differ from float32 by a mean relative L2 of "
        f"**{_num(diff['relative_l2_mean'])}** (largest layer {_num(diff['relative_l2_max_layer'])}; cosine "
        f"at least {_num(diff['cosine_min'], 6)}). The paper's code ran float32 (`config/paper.yaml`); bf16 "
        "is the faster option. The 7B-shaped figure measured on a GPU is in this page's GPU section.", ""]


# --------------------------------------------------------------------------- table 4, figure 10
def judge_human_table(agree: pd.DataFrame | None, published: dict) -> pd.DataFrame:
    """Table 4 beside the paper's: per dimension our judge's r, p and n (when ``agree``,
    from :func:`synclib.judge.human.agreement`, is given) and the paper's two columns."""
    paper = pd.DataFrame(published["table4"]["rows"]).rename(
        columns={"gpt-4": "paper GPT-4 r", "gpt-oss-120b": "paper gpt-oss-120b r"})
    if agree is None:
        return paper
    return agree[["dimension", "r", "p", "n"]].merge(paper, on="dimension", how="left")


def _judge_label(judge: str) -> str:
    from synclib.judge.sotopia_human import GPT4_JUDGE
    from synclib.models import EMBEDDED

    if judge == GPT4_JUDGE:
        return "GPT-4 (published scores)"
    return f"{judge} (tiny, embedded)" if judge in EMBEDDED else judge


def _episode_set_text(es: dict, rule: str | None = None) -> str:
    """Which rated episodes a judge's numbers rest on (an ``episode_set``, i.e.
    :func:`synclib.judge.human.episode_coverage`'s record, with its ``rule``), and why the
    others are left out; ids are named where a reason covers five or fewer.  Whole
    sentences, the first one open to the caller's start ("GPT-4 on ")."""
    def ids(x):
        return f": {', '.join(x)}" if len(x) <= 5 else ""

    rule = rule or es.get("rule")
    s = f"{es['episodes']} of the {es['rated_episodes']} rated episodes"
    if es.get("without_dialog"):
        s += f" ({len(es['without_dialog'])} of them without a dialog{ids(es['without_dialog'])})"
    s += "." + (f" Which and why: {rule}." if rule else "")
    left = [f"{x['n']}, reason: {x['reason']}{ids(x['episode_ids'])}" for x in es.get("left_out", [])]
    return s + (" Left out: " + "; ".join(left) + "." if left else " None left out.")


def measured_judge_table(measured: dict | None, published: dict) -> pd.DataFrame | None:
    """The judges measured on Sotopia-π's published ratings (``bench/bench_judge_human.py``'s
    JSON, :func:`synclib.judge.human.load_measured`): per dimension each judge's r, beside the
    paper's two columns (measured on other ratings).  None when nothing was measured."""
    if not measured:
        return None
    table = judge_human_table(None, published)
    for j in measured["judges"]:
        r = {d["dimension"]: np.nan if d["r"] is None else d["r"] for d in j["dimensions"]}
        table[f"{_judge_label(j['judge'])} r ({j['episodes']} episodes)"] = table["dimension"].map(r)
    return table


def sentence_measured_judges(measured: dict | None) -> str:
    """What the measured judges show, with where the numbers come from."""
    if not measured:
        return ("*Nothing measured on published ratings yet: `synclib fetch sotopia-human`, then "
                "`python bench/bench_judge_human.py [--local-judge smollm2-135m]`.*")
    parts = []
    for j in measured["judges"]:
        ok = [d for d in j["dimensions"] if d["r"] is not None and np.isfinite(d["r"])]
        best = max(ok, key=lambda d: d["r"]) if ok else None
        sig = [d["dimension"] for d in ok if d["p"] <= 0.01]
        none = [d for d in j["dimensions"] if d not in ok]
        gap = (f"; no r on {_join([d['dimension'] for d in none])} ({none[0].get('reason') or 'undefined'})"
               if none else "")
        on = _episode_set_text(j["episode_set"]) if j.get("episode_set") else f"{j['episodes']} episodes."
        parts.append(f"**{_judge_label(j['judge'])}** on {on} Over these {j['episodes']} episodes, {j['scores']} "
                     f"agent × dimension scores: r from {min(d['r'] for d in ok):.2f} to {best['r']:.2f} ({best['dimension']}), "
                     f"p ≤ 0.01 on {len(sig)} of 7 dimensions ({_join(sig) or 'none'}){gap}; "
                     f"{100 * j['within_one_sd']:.1f} % of its scores within one standard deviation of the "
                     "human ratings." if ok else
                     f"**{_judge_label(j['judge'])}** on {on} No dimension has a correlation.")
    from synclib.models import EMBEDDED

    tiny = [j for j in measured["judges"] if j["judge"] in EMBEDDED]
    note = (" The embedded judges are tiny models (135M / 270M parameters), measured here to show how far "
            "a judge that small is from people; the paper's judge is gpt-oss-120b." if tiny else "")
    return (f"Measured on {measured['ratings']['source']} ({measured['date']}, "
            "`bench/results/judge_human_sotopia_pi.json`): " + " ".join(parts) + note +
            " These are other episodes and other annotators than the paper's, so they test the judges "
            "the way appendix H does without being its numbers.")


def sentence_judge_human(agree: pd.DataFrame | None, share: float | None, n_scores: int,
                         judge: str, published: dict, coverage: dict | None = None) -> str:
    """What table 4 and figure 10 show for this judge, or what the page needs; ``coverage``
    (:func:`synclib.judge.human.episode_coverage`) says which rated episodes they rest on."""
    fig10 = published["fig10"]
    paper = _paper(published["table4"], "r from 0.22 to 0.71 (GPT-4) and 0.22 to 0.60 "
                   f"(gpt-oss-120b) across dimensions; {fig10['text']} ({fig10['source']}).")
    if agree is None:
        return ("No human ratings were given to this run, so its judge is not held against people "
                "here; the table shows the paper's numbers. To fill it, judge rated episodes (`synclib "
                "fetch sotopia-human` gets published ones) with `synclib evaluate EPISODES.jsonl` and set "
                "`notebooks.human_ratings` and `notebooks.human_judge_scores` (or the notebook's `ratings` "
                "and `judge_scores` parameters).") + paper
    ok = agree[np.isfinite(agree["r"])]
    rs = "; ".join(f"{r.dimension} r = {r.r:.2f} (p = {stats.format_p(r.p)}, n = {r.n})" for r in ok.itertuples())
    missing = [f"{r.dimension} ({r.reason})" for r in agree.itertuples() if not np.isfinite(r.r)]
    s = f"{_judge_label(judge)} against the human raters' mean: {rs or 'no dimension has a correlation'}."
    if missing:
        s += " No r for " + _join(missing) + "."
    if coverage is not None:
        s += " They rest on " + _episode_set_text(coverage, "those the judge's table scores")
    if share is not None and np.isfinite(share):
        s += (f" {100 * share:.1f} % of its {n_scores} scores lie within one standard deviation "
              f"of the human ratings (paper, {fig10['judge']}: {100 * fig10['within_one_sd']:.1f} %).")
    return s + paper
