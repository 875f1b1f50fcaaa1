"""The paper's claims, one line each: what this run finds (agrees, differs, cannot test), the effect, the test, p.

Every claim the paper makes about its figures and tables (``data/published.json``) has a
function here that reads a results directory (:class:`synclib.results.Results`) and returns
a :class:`Claim`.  :data:`CLAIMS` lists them in the paper's order; :func:`claims_summary`
gives the book's first page its list, and each figure's page quotes its own line, so the
two always agree.  A verdict (:data:`VERDICTS`) says what the run found: it *agrees* with the
paper (the test finds what the paper claims), it *differs* (the test finds the opposite, or
finds nothing where it would have detected the paper's effect), or it *cannot test* the
claim, with the reason (too few pairs, too few samples, too little power, relationship
confounded with scenario, a model that is not run, replies not in the decoded format).

The tests, and the statistical unit of each:

========================  ===============================================================
claim                     test
========================  ===============================================================
synchrony (fig 2)         genuine SyncR² against its surrogate partners (dialogs that never
                          met): the larger p of the rank among them and the episode
                          bootstrap of the gap (:func:`synclib.power.surrogate_test`)
controls (figs 3-4, and   genuine against each control: the larger p of the corrected
our pseudo-dyads)         re-split t-test and the episode bootstrap
                          (:func:`synclib.power.paired_control_tests`)
relationships (fig 5)     Pearson r of closeness with the categories' mean SyncR², over the
                          categories (the unit: a category's subsets share its scenarios)
social (fig 6, table 1,   a correlation over model pairs: needs pairs
fig 7)
clipping (fig 8)          none: keeping negatives can only lower SyncR²; the size is the
                          finding, at the paper's penalty
sample size (fig 9)       none: the run's size against the paper's
persona split (table 2)   corrected re-split t-test of the per-seed differences
nonlinear (table 5)       corrected re-split t-test of the MLP's minus the affine map's
                          test R² on the same layer pairs
ToM (fig 11)              per decoder, corrected re-split t-test of baseline minus decoder
                          test KL
judge (table 4, fig 10)   the measured judges on published human ratings (benchmark)
========================  ===============================================================
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from synclib import power, power_text, stats
from synclib.stats import MIN_N_CORR
from synclib.stats import fmt as _f
from synclib.stats import p_clause as _p

__all__ = ["Claim", "CLAIMS", "VERDICTS", "claim", "page_lines", "claims_summary", "PAPER_PAIRS",
           "EQUIVALENCE_MARGIN"]

#: what a run can find about a claim of the paper
AGREES, DIFFERS, CANNOT = "agrees", "differs", "cannot test"
VERDICTS = (AGREES, DIFFERS, CANNOT)

#: model pairs in the paper's figure 6
PAPER_PAIRS = 21
#: a "largely unchanged" claim (tables 2, 5) can be spoken to when the test detects a change this
#: large (SyncR² or R²) with 80 % power: the paper's own differences there are up to 0.05
EQUIVALENCE_MARGIN = 0.05


@dataclass
class Claim:
    """What a run says about one claim of the paper."""

    key: str       # its entry in data/published.json
    what: str      # the claim, short, with where the paper makes it
    verdict: str   # one of VERDICTS: "agrees", "differs" or "cannot test"
    text: str      # the effect, the test and p, or why the run cannot test it

    def line(self) -> str:
        """Markdown: ``what: **verdict**: text``."""
        return f"{self.what}: **{self.verdict}**: {self.text}"


def _who(res) -> str:
    return "the embedded models show" if res.embedded else "this run shows"


def _tiny(res) -> str:
    return " (the embedded tiny models, not the paper's)" if res.embedded else ""


# --------------------------------------------------------------------------- fig 2
def synchrony(res, published: dict) -> Claim:
    """Figure 2: the maps predict the partner's next state, beyond what dialogs that never met
    share (genuine against its surrogate partners; SyncR² is above 0 for unrelated states too,
    so 0 is not a null that can happen)."""
    what = "Synchrony: the maps predict the partner's next state (section 3.2, figure 2)"
    sync = res.sync_table()
    if not np.isfinite(sync["mean"]).any():
        return Claim("fig2", what, CANNOT, "this run has no genuine SyncR² (too few samples to fit the maps).")
    pairs = "; ".join(f"{r.pair} {_f(r.mean)}" for r in sync.itertuples())
    text = f"{_who(res)} genuine SyncR² {pairs} (per pair, the mean of its directional values)"
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
    text += (f" ({_p(t['p'])}: the larger of genuine's rank among the surrogates, {_p(t['p_rank'])}, and the "
             f"bootstrap, {_p(t['p_episodes'])})")
    if t["p"] < 0.05 and t["gap"] > 0:
        return Claim("fig2", what, AGREES, text + ".")
    floor = 1 / (1 + t["n_surrogates"])
    if floor >= 0.05:
        return Claim("fig2", what, CANNOT, text + f"; with {t['n_surrogates']} surrogates the rank test cannot go "
                     f"below p = {_f(floor, 3)}.")
    return Claim("fig2", what, DIFFERS, text + "; genuine is not above the surrogates.")


# --------------------------------------------------------------------------- figs 3-4
def _found(r) -> str:
    return (f"by {_f(power.reported_difference(r), 3)} SyncR² ({_p(r['p'])}: the larger of the corrected re-split "
            f"t-test over {int(r['n_pairs'])} split-seed values, {_p(r['p_corrected'])}, and the bootstrap over "
            f"{int(r['n_episodes'])} episodes, {_p(r['p_episodes'])})")


def _control_line(res, table, control: str, key: str, what: str, paper_difference: float | None) -> Claim:
    rows = table[table["control"] == control] if len(table) else table
    if not len(rows):
        return Claim(key, what, CANNOT, f"this run has no {control} condition.")
    r = rows.iloc[0]
    if why := power_text.why_untestable(r):
        return Claim(key, what, CANNOT, why + ".")
    if power.significantly_above(r):
        return Claim(key, what, AGREES, f"{_who(res)} genuine above {control} {_found(r)}.")
    mde = r["mde_corrected"]
    if np.isfinite(r["p"]) and r["p"] < 0.05:  # significant, but genuine below the control
        return Claim(key, what, DIFFERS, f"{_who(res)} genuine below {control} {_found(r)}.")
    if paper_difference is not None and np.isfinite(mde) and mde <= paper_difference:
        return Claim(key, what, DIFFERS, (
            f"not found, where a difference of {_f(paper_difference)} SyncR² (assumed; the paper prints no number) "
            f"would be detected from about {_f(mde, 3)}: {_found(r)}."))
    return Claim(key, what, CANNOT, f"not detected: {_found(r)}; this run detects differences from about "
                                    f"{_f(mde, 3)} only.")


def passive(res, published: dict, paper_difference: float = power_text.ASSUMED_PAPER_DIFFERENCE, table=None) -> Claim:
    """Figures 3-4a: the passive reader is below genuine."""
    table = power.paired_control_tests(res) if table is None else table
    return _control_line(res, table, "passive", "fig3_4", "Passive reader below genuine (section 4.2, figure 4a)",
                         paper_difference)


def lags(res, published: dict, table=None) -> Claim:
    """Figures 3-4b: synchrony collapses at lags 1 and 2."""
    table = power.paired_control_tests(res) if table is None else table
    what = "Synchrony collapses at lags k = 1, 2 (section 4.2, figure 4b)"
    rows = table[table["control"].str.startswith("lag")] if len(table) else table
    if not len(rows):
        return Claim("fig3_4", what, CANNOT, "this run has no lagged condition.")
    parts = [_control_line(res, table, c, "fig3_4", "", None) for c in rows["control"]]
    verdict = (AGREES if all(p.verdict == AGREES for p in parts) else
               DIFFERS if any(p.verdict == DIFFERS for p in parts) else CANNOT)
    text = "; ".join(f"{c}: {p.text.rstrip('.')}" for c, p in zip(rows["control"], parts))
    return Claim("fig3_4", what, verdict, text + ".")


def shuffled(res, published: dict, table=None) -> Claim:
    """The code's shuffled control (the paper does not report it)."""
    table = power.paired_control_tests(res) if table is None else table
    return _control_line(res, table, "shuffled", "fig3_4",
                         "The paper's code's shuffled control below genuine (not reported in the paper)", None)


def pseudo(res, published: dict, table=None) -> Claim:
    """Ours: pseudo-dyads (agents that never talked to each other) below genuine."""
    table = power.paired_control_tests(res) if table is None else table
    return _control_line(res, table, "pseudo", "fig3_4",
                         "Pseudo-dyads, agents of different dialogs, below genuine (ours; not in the paper)", None)


# --------------------------------------------------------------------------- fig 5
def relationships(res, published: dict) -> Claim:
    """Figure 5: SyncR² rises with closeness (appendix G)."""
    what = "SyncR² rises with relationship closeness (section 4.3, figure 5)"
    t = res.relationship_table()
    if t.empty:
        return Claim("fig5", what, CANNOT, "no category has a SyncR² in this run (too few samples to fit the maps)."
                     if t.attrs.get("present") else "this run has no relationship analysis.")
    c = res.relationship_closeness(t)
    from synclib.scenarios import CLOSENESS_CODES, RELATIONSHIPS

    five = {RELATIONSHIPS[k] for k in CLOSENESS_CODES}
    every = res.relationship_scenarios()
    scen = {k: v for k, v in every.items() if k in five}       # the categories in the correlation
    others = {k: v for k, v in every.items() if k not in five}
    few = {k: v for k, v in scen.items() if v < 3}
    text = (f"{c.describe()} between closeness (the paper's five codes, strangers 0 to romantic 4) and the "
            f"categories' mean SyncR², over the {c.n} of them this run has (the unit: a category's test "
            f"subsets share its scenarios)")
    if scen:
        text += "; scenarios per category: " + ", ".join(f"{k} {v}" for k, v in scen.items())
    if others:
        text += " (outside the five codes, not in the correlation: " + ", ".join(f"{k} {v}" for k, v in others.items()) + ")"
    if few:
        return Claim("fig5", what, CANNOT, text + (
            f". Relationship is confounded with scenario: {', '.join(few)} come from fewer than 3 scenarios each."))
    if c.n < MIN_N_CORR + 2:
        return Claim("fig5", what, CANNOT, text + f". {c.n} categories are too few for a correlation.")
    if c.ok and c.r > 0 and c.p < 0.05:
        return Claim("fig5", what, AGREES, text + ".")
    return Claim("fig5", what, DIFFERS, text + ": no positive correlation at p < 0.05.")


# --------------------------------------------------------------------------- fig 6, table 1, fig 7
def _pairs_text(res) -> tuple[bool, str]:
    """Whether the run has enough model pairs for a correlation over them, and the count in words."""
    n = len(res.pair_names)
    enough = n >= MIN_N_CORR + 2
    note = "" if enough else " (a correlation over so few points is not evidence)"
    return enough, f"{n} model pair{'s' if n != 1 else ''} here, {PAPER_PAIRS} in the paper{note}{_tiny(res)}"


def social(res, published: dict) -> Claim:
    """Figure 6 and table 1: SyncR² tracks social performance (also given ability)."""
    what = "SyncR² tracks social performance, also given IFEval and MuSR (section 5, figure 6, table 1)"
    enough, text = _pairs_text(res)
    if not enough:
        return Claim("fig6", what, CANNOT, text + ".")
    t = res.pair_table()
    c = stats.pearson(t["sync"], t["social"])
    text += f"; SyncR² against the judged social score over the pairs: {c.describe()}"
    if not c.ok:
        return Claim("fig6", what, CANNOT, text + ".")
    return Claim("fig6", what, AGREES if c.r > 0 and c.p < 0.05 else DIFFERS, text + "; the partial correlations "
                 "given ability are on the table 1 page.")


def topk(res, published: dict) -> Claim:
    """Figure 7: the correlation with social performance holds for every top-k."""
    what = "The correlation holds for every top-k (appendix C.1, figure 7)"
    enough, text = _pairs_text(res)
    if not enough:
        return Claim("fig7", what, CANNOT, text + "; the top-k SyncR² itself is on the figure 7 page.")
    t = res.topk_correlations()
    t = t[np.isfinite(t["r"].astype(float))] if len(t) else t
    if t.empty:
        return Claim("fig7", what, CANNOT, text + "; no family has enough pairs for a correlation.")
    held = int((t["significant"] & (t["r"] > 0)).sum())
    text += f"; positive at p < 0.05 for {held} of {len(t)} (family, k) correlations"
    return Claim("fig7", what, AGREES if held == len(t) else DIFFERS, text + ".")


# --------------------------------------------------------------------------- fig 8
def clipping(res, published: dict) -> Claim:
    """Figure 8: keeping negative R² lowers SyncR² and inflates its standard error."""
    what = "Keeping negative R² lowers SyncR² and inflates its standard error (appendix C.2, figure 8)"
    t = res.clipping_table()
    paper = t[t["penalty"] == "paper"] if len(t) else t
    if paper.empty:
        return Claim("fig8", what, CANNOT, "this run's analyses have no unclipped SyncR².")
    s = res.clipping_summary(paper)
    if not s["n_pairs"]:
        return Claim("fig8", what, CANNOT, "this run has no SyncR² at the paper's penalty (too few samples to fit "
                                             "the maps).")
    text = (f"at the paper's λ = {s['alpha']:g}, keeping negatives takes the mean SyncR² over pairs from "
            f"{_f(s['clipped'])} to {_f(s['kept'])} and its standard error by a factor of {_f(s['se_ratio'], 1)} "
            "(median over pairs); no test: the unclipped value can never exceed the clipped one, so the size "
            "is the finding")
    own = t[t["penalty"] == "run"]
    if len(own):
        o = res.clipping_summary(own)
        text += (f". At this run's own penalty ({res.penalty_label()}) the two are {_f(o['clipped'])} and "
                 f"{_f(o['kept'])}")
    verdict = AGREES if s["kept"] < s["clipped"] else DIFFERS
    return Claim("fig8", what, verdict, text + ".")


# --------------------------------------------------------------------------- fig 9
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
    sizes = res.dataset_sizes()
    total = max(sizes.values())
    paper_n = f9.get("n_samples", 6500)
    text = (f"this run's genuine datasets hold " + ", ".join(f"{p} {n}" for p, n in sizes.items())
            + f" samples each (training + test, the mean over directions and split seeds: figure 9's last points), "
            f"{paper_n:,} in the paper; the curve up to this run's size is on the figure 9 page")
    if total < paper_n:
        return Claim("fig9", what, CANNOT, text + ": the run ends before the paper's size.")
    curve = res.sample_size_table()
    at = curve[curve["n_samples"] <= paper_n].groupby("pair")["mean"].last()
    end = curve.groupby("pair")["mean"].last()
    gain = (end - at).dropna()
    if gain.empty:
        return Claim("fig9", what, CANNOT, text + "; the sweep has no point at or below the paper's size.")
    text += f"; gain beyond it up to {_f(float(gain.max()), 3)} SyncR² (largest over pairs)"
    return Claim("fig9", what, AGREES if gain.max() < EQUIVALENCE_MARGIN else DIFFERS, text + ".")


# --------------------------------------------------------------------------- tables 2, 5
def _resplit_line(d: dict, quantity: str) -> str:
    return (f"{quantity} {_f(d['mean'], 3)} ({_p(d['p'])}, corrected re-split t-test over {d['n']} paired values; "
            f"detectable from about {_f(d['mde'], 3)})")


def _setting_claim(res, key: str, setting: str, what: str, missing: str, one_sided: bool = False) -> Claim:
    """Tables 2 and 5: a setting against the original (:func:`synclib.power.setting_test`). The
    paper finds them about the same: a run agrees where it would detect a change of
    :data:`EQUIVALENCE_MARGIN` and finds none, differs where it finds one at p < 0.05 (with
    ``one_sided``, only a rise: "no better" holds when the setting is worse), and cannot test
    the claim otherwise."""
    d = power.setting_test(res, setting)
    if d["n"] < 2 and res.runs_with(power.SETTINGS[setting][0]):
        return Claim(key, what, CANNOT, f"{d['n']} paired value(s) here, too few for a test (too few samples to "
                                          "fit the maps).")
    if d["n"] < 2:
        return Claim(key, what, CANNOT, missing)
    quantity = power.SETTINGS[setting][2]
    if d["n_layer_pairs"]:
        quantity += f" on {d['n_layer_pairs']} layer pairs per direction"
    found = bool(np.isfinite(d["p"]) and d["p"] < 0.05)
    powered = bool(np.isfinite(d["mde"]) and d["mde"] <= EQUIVALENCE_MARGIN)
    # the paper finds the setting no better (table 5: the MLP) or unchanged (table 2)
    against = found and (d["mean"] > 0 if one_sided else True)
    line = _resplit_line(d, quantity)
    if against:
        return Claim(key, what, DIFFERS, line + f"; {_who(res)} a difference at p < 0.05.")
    if found:  # table 5: the MLP significantly worse than the affine map, which is no better
        return Claim(key, what, AGREES, line + f"; {_who(res)} it below 0 at p < 0.05 (worse, so no better).")
    if powered:
        return Claim(key, what, AGREES, line + f"; a change of {EQUIVALENCE_MARGIN} or more would be detected, "
                                               "and none is.")
    return Claim(key, what, CANNOT, line + f"; a change of {EQUIVALENCE_MARGIN} (the paper's largest) would not be "
                                           "detected with 80 % power.")


def persona(res, published: dict) -> Claim:
    """Table 2: SyncR² is largely unchanged with a persona-disjoint split."""
    return _setting_claim(res, "table2", "persona", "SyncR² unchanged with a persona-disjoint split (appendix E, "
                          "table 2)", "this run has no persona-disjoint analysis.")


def nonlinear(res, published: dict) -> Claim:
    """Table 5: nonlinear maps do not capture systematically more than affine ones."""
    return _setting_claim(res, "table5", "nonlinear", "Nonlinear maps no better overall than affine ones "
                          "(appendix I, table 5)", "this run has no MLP comparison (or one split seed).",
                          one_sided=True)


# --------------------------------------------------------------------------- fig 11
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


# --------------------------------------------------------------------------- table 4, fig 10
def judge(res, published: dict) -> Claim:
    """Table 4 and figure 10: the paper's judge agrees with people."""
    from synclib.judge.human import load_measured
    from synclib.models import EMBEDDED

    what = "The paper's judge (gpt-oss-120b) agrees with human ratings (appendix H, table 4, figure 10)"
    measured = load_measured()
    text = "gpt-oss-120b is not run here"
    if measured:
        parts = []
        for j in measured["judges"]:
            rs = [d["r"] for d in j["dimensions"] if d["r"] is not None and np.isfinite(d["r"])]
            tiny = " (tiny, embedded)" if j["judge"] in EMBEDDED else ""
            parts.append(f"{j['judge']}{tiny}: r from {_f(min(rs))} to {_f(max(rs))} over {len(rs)} dimensions, "
                         f"{j['episodes']} episodes" if rs else f"{j['judge']}{tiny}: no correlation")
        text += ("; the benchmark measures other judges on Sotopia-π's published human ratings (the table 4 "
                 "page): " + "; ".join(parts))
    return Claim("table4", what, CANNOT, text + ".")


#: every claim, in the paper's order: (function, published.json key)
CLAIMS: tuple[tuple[Callable, str], ...] = (
    (synchrony, "fig2"), (passive, "fig3_4"), (lags, "fig3_4"), (shuffled, "fig3_4"), (pseudo, "fig3_4"),
    (relationships, "fig5"),
    (social, "fig6"), (social, "table1"), (topk, "fig7"), (clipping, "fig8"), (sample_size, "fig9"),
    (persona, "table2"), (judge, "table4"), (judge, "fig10"), (nonlinear, "table5"), (tom, "fig11"),
)


#: the claims that read the paired tests of the controls (one table serves them all)
_CONTROL_CLAIMS = (passive, lags, shuffled, pseudo)


def claim(key: str, res, published: dict) -> list[Claim]:
    """The claims of one ``data/published.json`` entry (e.g. ``"fig3_4"``: passive, lags, shuffled, pseudo)."""
    fns = list(dict.fromkeys(f for f, k in CLAIMS if k == key))
    if not fns:
        raise KeyError(f"no claim for {key!r}; keys: {sorted({k for _, k in CLAIMS})}")
    return [f(res, published) for f in fns]


def page_lines(key: str, res, published: dict) -> str:
    """Markdown for a figure's page: its claims' lines as the first page lists them."""
    lines = [c.line() for c in claim(key, res, published)]
    return "**The paper's claim and this run** (as on the first page): " + " ".join(lines)


def claims_summary(res, published: dict) -> list[str]:
    """One Markdown line per claim of the paper (:data:`CLAIMS`, each function once)."""
    table = power.paired_control_tests(res)
    out = []
    for fn in dict.fromkeys(f for f, _ in CLAIMS):
        c = fn(res, published, table=table) if fn in _CONTROL_CLAIMS else fn(res, published)
        out.append(c.line())
    return out

