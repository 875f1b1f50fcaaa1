"""Sentences and tables that put our numbers beside the paper's.

Each ``sentence_*`` function takes the tidy table a notebook drew (from
:class:`synclib.results.Results`) and the published numbers
(:func:`synclib.results.load_published`) and returns Markdown: one sentence computed from
the table, then the paper's number or claim with its source.  Nothing in a sentence is
written in advance: every number, comparison word and count comes from the table.

The book's generated pages live elsewhere: the run summary and the embedded models page's
account of the run in :mod:`synclib.run_summary`, the benchmarks page in :mod:`synclib.benchmarks`.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from synclib import stats
from synclib.stats import fmt as _f

__all__ = ["banner", "sentence_fig1", "sentence_fig2", "sentence_generalisation", "sentence_controls",
           "sentence_relationship", "readable", "published_correlations", "sentence_fig6", "partial_table", "sentence_table1",
           "sentence_topk", "sentence_clipping", "sentence_sample_size", "sample_curve_markdown",
           "sample_counts_text", "comparison_with_paper", "wide_table", "sentence_comparison",
           "sentence_tom", "sentence_judged", "judge_human_table", "measured_judge_table",
           "sentence_measured_judges", "sentence_judge_human", "sentence_cka", "sentence_pseudo", "sentence_surrogates", "sentence_mlp_training", "sentence_rounds",
           "sentence_matching", "passive_share"]


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


def _empty(what: str, var: str, table: pd.DataFrame | None = None) -> str:
    """Why a table has nothing to show: the analyses lack ``var``, or (``table.attrs["present"]``,
    set by :class:`synclib.results.Results`) they have it but no value could be computed."""
    if table is not None and table.attrs.get("present"):
        return (f"This run's analyses hold the {what} (`{var}`), but none of its values could be computed (too few "
                "samples to fit the maps), so there is nothing to compare.")
    return (f"This run has no {what} (the analysis files lack `{var}`), so there is nothing "
            "to compare; enable it in the run configuration and re-run `make book`.")


# --------------------------------------------------------------------------- figure 1
def sentence_fig1(fig, published: dict, embedded: bool) -> str:
    """What figure 1's map is (:func:`synclib.illustrate.figure1`), or why the run has none, with
    the paper's caption."""
    i = fig.info
    p = published["fig1"]
    if not i["fitted"]:
        return (f"No map is drawn: {i['reason']}. A run with more samples per dataset (more tasks or seeds, longer "
                "dialogs, or `analysis.n_samples: null`, which splits all samples 80/20 by episode) fits one; "
                "`synclib run --dry-run` prints how many samples each dataset will have."
                + _paper(p, p["caption"]))
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
    return s + _paper(p, p["caption"])


# --------------------------------------------------------------------------- figure 2
def sentence_fig2(frames: dict[str, pd.DataFrame], published: dict, direction: str) -> str:
    """Mean best-target R² per pair and the share of negative cells."""
    parts, neg, total = [], 0, 0
    frames = {name: f[f["r2"].astype(float).notna()] for name, f in frames.items()}
    if not any(len(f) for f in frames.values()):
        return (f"No layer pair has a test R² in this run ({direction}): too few samples to fit a map."
                + _paper(published["fig2"], published["fig2"]["claim"]))
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


def sentence_generalisation(summary: pd.DataFrame, published: dict, embedded: bool = False) -> str:
    """How much the maps lose from training to test R² per ordered run
    (:meth:`synclib.results.Results.generalisation_summary`): the median and mean gap, the
    median R² on each side, the share of layer pairs with a positive test R² and the samples
    per dataset; then the paper's discussion."""
    p = published["fig2"]
    paper = _paper({"source": p.get("generalisation_source", p.get("source"))}, p.get("generalisation", p["claim"]))
    if summary.empty:
        return _empty("training R² of the maps", "train_r2", summary) + paper
    parts = []
    for _, r in summary.iterrows():
        n = (f", on a mean of {_f(r['n_train'], 0)} training and {_f(r['n_test'], 0)} test samples per dataset"
             if np.isfinite(r["n_train"]) and np.isfinite(r["n_test"]) else "")
        parts.append(f"{r['run']} loses a median of {_f(r['gap_median'], 3)} (mean {_f(r['gap_mean'], 3)}; median "
                     f"training R² {_f(r['train_median'], 3)}, test {_f(r['test_median'], 3)}) and keeps a positive "
                     f"test R² in {_f(100.0 * r['share_positive'], 0)}% of its {int(r['layer_pairs'])} layer pairs{n}")
    who = ("These are the embedded tiny models, not the paper's: with so few samples per dataset the gap says how "
           "much these maps overfit, not how the paper's maps do. " if embedded else "")
    s = (who + "From training to test R² (the genuine maps of every layer pair, both directions, each R² the mean "
         "over split seeds), " + "; ".join(parts) + ".")
    return s + paper


# --------------------------------------------------------------------------- figures 3, 4
def _versus(sync: pd.DataFrame, other: pd.DataFrame, what: str,
            where: str = "the tests are in the table above and the claims below") -> str:
    m = sync[["pair", "mean"]].merge(other[["pair", "mean"]], on="pair", suffixes=("_g", "_c"))
    m = m[np.isfinite(m["mean_g"]) & np.isfinite(m["mean_c"])]
    if m.empty:
        return (f"No pair of this run has a SyncR² both genuine and with {what} (too few samples to fit the maps), "
                "so they cannot be compared.")
    lower = int((m["mean_c"] < m["mean_g"]).sum())
    return (f"With {what} SyncR² is lower than in the genuine interaction for {lower} of {len(m)} "
            f"pairs (the mean over pairs of each pair's SyncR²: {_f(m['mean_g'].mean())} genuine vs "
            f"{_f(m['mean_c'].mean())}; {where}).")


def passive_share(sync: pd.DataFrame, passive: pd.DataFrame | None) -> str:
    """What share of genuine SyncR² the passive reader keeps, over the pairs that have both:
    ``"the passive reader keeps 92 % of genuine SyncR² (S-S 0.40 of 0.43, ...)"``, or ``""``."""
    if passive is None or passive.empty:
        return ""
    m = sync[["pair", "mean"]].merge(passive[["pair", "mean"]], on="pair", suffixes=("_g", "_p"))
    m = m[np.isfinite(m["mean_g"]) & np.isfinite(m["mean_p"]) & (m["mean_g"] > 0)]
    if m.empty:
        return ""
    share = 100 * (m["mean_p"] / m["mean_g"]).mean()
    return (f"the passive reader, who reads the same dialog without taking part in it, keeps {share:.0f} % of "
            f"genuine SyncR² (the mean over pairs; " + _join([f"{r.pair} {_f(r.mean_p)} of {_f(r.mean_g)}"
                                                           for r in m.itertuples()]) + ")")


def sentence_controls(control: pd.DataFrame, lag: pd.DataFrame, sync: pd.DataFrame,
                      passive: pd.DataFrame | None, published: dict,
                      shuffled: pd.DataFrame | None = None) -> str:
    """Passive and shuffled vs genuine per pair (None: the run lacks that condition), and
    the change from lag 0 to the largest lag."""
    if passive is None:
        s1 = "This run has no passive-reader condition (`simulate.passive` was off)."
    else:
        s1 = _versus(sync, passive, "the passive reader")
        if share := passive_share(sync, passive):
            s1 += (f" {share[0].upper()}{share[1:]}: that much of what the maps predict comes from the input "
                   "the two share, and only the rest needs the agent to take part in the dialog.")
    if shuffled is not None:
        s1 += (" " + _versus(sync, shuffled, "the shuffled control (training targets permuted "
                             "within each dialog, the paper's code's control)"))
    kmax = int(lag["k"].max()) if len(lag) else 0
    k0 = lag[lag["k"] == 0]["mean"].mean() if kmax > 0 else math.nan
    kk = lag[lag["k"] == kmax]["mean"].mean() if kmax > 0 else math.nan
    if kmax > 0 and np.isfinite(k0) and np.isfinite(kk):
        word = "falls" if kk < k0 else "rises"
        s2 = f" From lag k = 0 to k = {kmax}, the mean SyncR² over pairs {word} from {_f(k0)} to {_f(kk)}."
    elif kmax > 0:
        s2 = f" The run has lags up to k = {kmax}, but no SyncR² at lag 0 and k = {kmax} to compare (too few samples)."
    else:
        s2 = " This run has no lagged conditions."
    p = published["fig3_4"]
    return s1 + s2 + _paper(p, p["claim_passive"] + " " + p["claim_lag"])


def sentence_cka(table: pd.DataFrame, embedded: bool, synthetic: bool = False) -> str:
    """Linear CKA (ours; the paper has none) per condition, and whether it orders genuine
    against each control as SyncR² does (:meth:`synclib.results.Results.cka_table`)."""
    if table.empty:
        return ("This run's analysis files lack `cka` (they were written before synclib computed CKA): "
                "re-analyse the cubes to add it.")
    by = table.groupby("condition", sort=False)[["mean", "sync_r2"]].mean()
    parts = [f"{_f(by.loc[c, 'mean'])} {c}" for c in by.index]
    s = (f"Linear CKA between one agent's states and the partner's next states (every layer pair, on all "
         f"{_span(table['n_min'].min(), table['n_max'].max())} samples of each dataset: nothing is fitted, so no "
         f"split), averaged over layer pairs, directions and pairs: {_join(parts)}.")
    if "genuine" in by.index:
        g = by.loc["genuine"]
        orders = []
        for c in (c for c in by.index if c != "genuine"):
            cka_word, sync_word = ("above" if g["mean"] > by.loc[c, "mean"] else "below",
                                   "above" if g["sync_r2"] > by.loc[c, "sync_r2"] else "below")
            orders.append(f"{c}: CKA puts genuine {cka_word} it, SyncR² {sync_word} "
                          f"({_f(g['sync_r2'])} vs {_f(by.loc[c, 'sync_r2'])}), "
                          + ("the same order" if cka_word == sync_word else "opposite orders"))
        if orders:
            s += " Against each control, " + "; ".join(orders) + "."
    return (s + f" These are {_whose(embedded, synthetic)}, never the paper's: the paper reports no CKA (a second "
            "measure, ours).")


def _whose(embedded: bool, synthetic: bool) -> str:
    return ("numbers from synthetic test data" if synthetic else "the embedded tiny models' numbers" if embedded
            else "this run's models' numbers")


# --------------------------------------------------------------------------- beyond the paper: controls and rounds
def sentence_matching(table: pd.DataFrame, counts: pd.DataFrame, embedded: bool, synthetic: bool = False) -> str:
    """What fitting every condition on equal samples changed (:meth:`synclib.results.Results.matching_table`),
    or, for a run that fits each condition on its own samples, how unequal the counts are
    (:meth:`synclib.results.Results.sample_counts`)."""
    if table.empty:
        n = counts.groupby("condition", sort=False)["n_train"].mean() if len(counts) else pd.Series(dtype=float)
        return ("This run fits every condition on its own samples (`analysis.equal_samples` is off, as in the paper's "
                "code)" + (": training samples per dataset, the mean over directions, split seeds and runs, "
                           + _join([f"{c} {_f(v, 0)}" for c, v in n.items()]) if len(n) else "")
                + ". A control with fewer samples is lower partly because of its count (figure 9's curve).")
    span = _span(round(table["n_train"].min()), round(table["n_train"].max()))
    own = _span(round(table["n_train_genuine_own"].min()), round(table["n_train_genuine_own"].max()))
    parts = []
    for control, t in table.groupby("control", sort=False):
        parts.append(f"{control} {_f(t['gap_own'].mean(), 3)} on each condition's own samples, "
                     f"{_f(t['gap_equal'].mean(), 3)} on equal ones ({_f(t['removed'].mean(), 3, sign=True)} was the "
                     f"sample count; own samples: {_f(t['n_train_control_own'].mean(), 0)})")
    return (f"Every condition is fitted on the same number of samples: {span} training samples per dataset (the mean "
            f"over directions and split seeds; the smallest condition's count), where on all its own samples genuine "
            f"has {own}. The gap genuine minus control, the mean over pairs: " + "; ".join(parts) + ". The tests, "
            f"claims and charts of this page and the others use the equal-sample fits. These are "
            f"{_whose(embedded, synthetic)}; the paper fixes 6,500 samples for every condition.")



def sentence_pseudo(sync: pd.DataFrame, pseudo: pd.DataFrame | None, partners: list[str], embedded: bool,
                    synthetic: bool = False) -> str:
    """The pseudo-dyads (ours) against genuine per pair (:meth:`synclib.results.Results.sync_table`),
    with the partner rule the analyses used (their ``pseudo_partner`` attribute)."""
    if pseudo is None or pseudo.empty:
        return ("This run has no pseudo-dyads (`analysis.pseudo_dyads` was off, or the analysis files predate them): "
                "re-analyse the cubes to add them.")
    rule = _join(sorted(set(partners))) or "not recorded"
    return (f"Here the partner dialog is {rule}. "
            + _versus(sync, pseudo, "pseudo-dyads", "the paired tests are in the table of paired tests below, the "
                      "claim at the end of the page")
            + f" These are {_whose(embedded, synthetic)}; the paper has no pseudo-dyads (ours, after the "
            "hyperscanning literature's control).")


def sentence_surrogates(table: pd.DataFrame, embedded: bool, synthetic: bool = False) -> str:
    """Genuine against its surrogate partners per pair (:func:`synclib.power.surrogate_table`),
    with the persona confound where the surrogates change the personas."""
    if table is None or table.empty:
        return _empty("surrogate partners", "sync_r2_surrogate", table)
    parts = []
    for r in table.itertuples():
        above = int(round(r.share_below * r.n_surrogates))
        p = f"; {stats.p_clause(r.p)}" if np.isfinite(r.p) else ""
        ci = (f", 95 % interval {_f(r.ci_lo, 3)} to {_f(r.ci_hi, 3)}" if np.isfinite(r.ci_lo) else "")
        parts.append(f"{'over all runs' if r.pair == 'all' else r.pair} genuine {_f(r.genuine)} is above "
                     f"{above} of its {r.n_surrogates} surrogates (their mean {_f(r.surrogate_mean)}, at most "
                     f"{_f(r.surrogate_max)}; gap {_f(r.gap, 3)}{ci}{p})")
    same = float(np.nanmean(table["same_personas"]))
    n_seeds = int(table["n_sim_seeds"].min())
    confound = (f"In {_f(100 * (1 - same), 0)} % of the surrogate samples the partner dialog has other personas "
                "(and mostly another scenario)"
                + (": the run has one simulation seed, so no surrogate keeps the task. The gap therefore mixes "
                   "the exchange itself with what a dialog's own personas and scenario text share; the same task "
                   "under two or more simulation seeds would separate them." if n_seeds < 2 else
                   "; the first surrogates of each dialog are the same task under the other simulation seeds, "
                   "which keep the personas and the scenario."))
    return (f"Against the surrogate distribution: {_join(parts)}. The p is the larger of genuine's rank among "
            f"the surrogates and the bootstrap of the gap over whole episodes. {confound} These are "
            f"{_whose(embedded, synthetic)}; the paper has no surrogates (ours, after hyperscanning practice).")


def sentence_rounds(rounds: pd.DataFrame, trend: pd.DataFrame, embedded: bool, synthetic: bool = False) -> str:
    """Synchrony per round of the test episodes and its trend (:mod:`synclib.rounds`)."""
    from synclib.rounds import MIN_TEST_SAMPLES

    if rounds.empty and rounds.attrs.get("has_rounds"):
        return ("No round of the test episodes has a SyncR² in this run (too few samples to fit the maps).")
    if rounds.empty:
        return ("This run's analysis files lack `sync_r2_round` (they predate the scores per round): re-analyse "
                "the cubes to add them.")

    def trend_of(condition: str) -> str:
        parts = []
        for _, t in trend[trend["condition"] == condition].iterrows():
            if not np.isfinite(t["slope"]):
                parts.append(f"{t['pair']}: too few rounds with {MIN_TEST_SAMPLES} or more test samples for a trend")
                continue
            verdict = ("shows no detectable trend" if not (np.isfinite(t["p_holm"]) and t["p_holm"] < 0.05)
                       else "rises" if t["slope"] > 0 else "falls")
            parts.append(f"{t['pair']}: from {_f(t['first'])} in round {int(t['first_round'])} to {_f(t['last'])} in "
                         f"round {int(t['last_round'])}, {verdict} (slope {_f(t['slope'], 3)} per round, 95 % "
                         f"interval {_f(t['ci_lo'], 3)} to {_f(t['ci_hi'], 3)}, {stats.p_clause(t['p_holm'])} "
                         f"Holm-adjusted ({stats.p_clause(t['p'])} alone), over {int(t['n_boot'])} resamples of "
                         f"{int(t['n_episodes'])} episodes)")
        return "; ".join(parts)

    pseudo = (f" The pseudo-dyads (agents of different dialogs): {trend_of('pseudo')}."
              if (trend["condition"] == "pseudo").any() else "")
    thin = rounds[~rounds["kept"]]
    left = (f" Rounds with fewer than {MIN_TEST_SAMPLES} test samples (mean over split seeds) are drawn hollow and "
            f"left out of the trend ({len(thin)} of {len(rounds)} points)." if len(thin) else "")
    n = rounds[rounds["condition"] == "genuine"]["n_test"]
    family = int(np.isfinite(trend["p"].astype(float)).sum())
    return ("Genuine SyncR² per round of the test episodes, the maps fitted on all rounds of the training episodes, "
            "each source layer scored at the target layer chosen on the whole test set, without a clip (so a "
            "round can be below 0, and the rounds average to the unclipped SyncR²): "
            + trend_of("genuine") + f". A round rests on {_f(n.min(), 0)}–{_f(n.max(), 0)} test samples per split; "
            f"the p-values are Holm-adjusted over the {family} trend tests of this page's table (every pair and "
            "condition), and a trend counts where the adjusted p is below 0.05."
            + pseudo + left + f" These are {_whose(embedded, synthetic)}; the paper scores whole dialogs only (ours).")


def _span(lo, hi) -> str:
    return f"{int(lo)}" if int(lo) == int(hi) else f"{int(lo)}–{int(hi)}"


# --------------------------------------------------------------------------- figure 5
def sentence_relationship(table: pd.DataFrame, published: dict, res=None) -> str:
    """Mean SyncR² per relationship, the test of closeness over the paper's five categories
    (:meth:`synclib.results.Results.relationship_closeness`), how family_member is treated,
    and how many scenarios each category comes from."""
    from synclib.scenarios import CLOSENESS_CODES, RELATIONSHIPS

    p = published["fig5"]
    if table.empty:
        return _empty("relationship analysis", "relationship_sync_r2", table) + _paper(p, p["claim"])
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
        return _empty("top-k sensitivity analysis", "sync_r2_topk", topk) + _paper(p, p["claim"])
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
    return s + _paper(p, p["claim"])


# --------------------------------------------------------------------------- figure 8
def sentence_clipping(table: pd.DataFrame, published: dict, res=None) -> str:
    """Effect of keeping negative R² on SyncR² and its standard error, at each penalty of
    ``table`` (:meth:`synclib.results.Results.clipping_table`): the paper's and the run's own."""
    p = published["fig8"]
    if table.empty:
        return _empty("unclipped SyncR²", "sync_r2_noclip", table) + _paper(p, p["claim"])
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
        return _empty("unclipped SyncR²", "sync_r2_noclip", table) + _paper(p, p["claim"])
    return " ".join(parts) + _paper(p, p["claim"])


# --------------------------------------------------------------------------- figure 9
def sentence_sample_size(table: pd.DataFrame, published: dict) -> str:
    """SyncR² at the smallest and largest training sizes, and the last step's gain."""
    p = published["fig9"]
    table = table[np.isfinite(table["mean"].astype(float))]
    if table.empty:
        return _empty("sample-size analysis", "sample_size_sync_r2", table) + _paper(p, p["claim"])
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
    """``label x setting`` table of ``mean ± se`` strings (for display); "n/a" where the run has
    no value."""
    cell = long.assign(value=[f"{m:.2f} ± {s:.2f}" if np.isfinite(m) and np.isfinite(s) else _f(m)
                              for m, s in zip(long["mean"], long["se"])])
    return cell.pivot(index="label", columns="setting", values="value").reindex(
        index=list(dict.fromkeys(long["label"])), columns=list(dict.fromkeys(long["setting"]))).fillna("n/a")


def sentence_mlp_training(training: pd.DataFrame) -> str:
    """How long table 5's MLPs trained (:meth:`synclib.results.Results.mlp_training`)."""
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


def sentence_comparison(ours: pd.DataFrame, entry: dict, what: str, var: str,
                        quantity: str = "SyncR²") -> str:
    """Difference between the two settings, ours and the paper's.

    ``quantity`` names what our numbers are (e.g. when they are not a full SyncR²).
    """
    a, b = entry["settings"]
    pub = "; ".join(f"{r['pair']} {r[a][0]:.2f} / {r[b][0]:.2f}" for r in entry["rows"])
    pub = f"{a} / {b}: {pub}."
    if ours.empty:
        return _empty(what, var, ours) + _paper(entry, pub)
    w = ours.pivot(index="pair", columns="setting", values="mean")
    d = (w[b] - w[a]).dropna() if {a, b} <= set(w.columns) else pd.Series(dtype=float)
    if d.empty:
        return (f"No pair of this run has a {quantity} in both settings (too few samples to fit them), so there is "
                "nothing to compare." + _paper(entry, pub))
    s = (f"{b.capitalize()} minus {a} {quantity} over our {len(d)} pairs: mean {d.mean():+.3f} "
         f"(from {d.min():+.3f} to {d.max():+.3f}); {int((d > 0).sum())} of {len(d)} pairs are "
         f"higher with the {b} setting.")
    return s + _paper(entry, pub)


# --------------------------------------------------------------------------- figure 11
def sentence_tom(table: pd.DataFrame, published: dict) -> str:
    """How many decoders beat the train-mean baseline."""
    p = published["fig11"]
    if table.empty:
        return _empty("Theory-of-Mind decoding", "tom_kl", table) + _paper(p, p["claim"])
    keys = ["pair", "target", "relation"]
    dec = table[table["decoder_or_baseline"] == "decoder"].set_index(keys)["mean"]
    base = table[table["decoder_or_baseline"] == "baseline"].set_index(keys)["mean"]
    both = pd.concat({"dec": dec, "base": base}, axis=1).dropna()
    if both.empty and not np.isfinite(dec.astype(float)).any():
        return "No decoder could be fitted in this run (too few ToM samples)." + _paper(p, p["claim"])
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
