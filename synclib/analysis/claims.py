"""The paper's claims judged on a run, once: their numbers, tests, p-values and verdicts.

The main job's claims step writes ``RESULTS/claims.json`` (:func:`write`); the pages read it through
:meth:`Results.claims <synclib.analysis.results.Results.claims>`, ``claim`` and ``tests`` and run no test, so no
two pages can disagree.  It holds ``tests`` (:func:`test_tables`) and ``claims``, one record per :data:`CLAIMS`
entry: ``id``, ``page`` (the notebook showing it), ``keys`` (its ``data/published.json`` entries), ``what``,
``verdict`` (:data:`VERDICTS`), ``reason`` (the branch of its rule that gave the verdict), ``measures`` (the
numbers it rests on, with ``p`` and ``p_holm``) and ``numbers`` (the claim's other numbers).

A verdict that rests on a test reads its p after Holm's adjustment across every claim's tests, at :data:`LEVEL`;
where the raw p would give another verdict, the claim is "inconclusive, leaning" to that one, and shows both p.
The tests, and the statistical unit of each:

================================  ======================================================================================
claim                             test
================================  ======================================================================================
synchrony (fig 2)                 genuine SyncR² against its surrogate partners (dialogs that never met): the larger p
                                  of its rank among them and the episode bootstrap of the gap; "generalises" by a stated
                                  rule (:data:`GENERALISES`)
controls (figs 3-4)               genuine against each control on the rows both hold: the larger p of the corrected
                                  re-split t-test and the episode bootstrap; "collapses" and "crucially depends" by a
                                  stated rule (:data:`COLLAPSES`)
relationships (fig 5)             Pearson r of closeness with the categories' SyncR² (the mean of the pairs' means) over
                                  the categories every pair has
social (figs 6-7, table 1)        a correlation over model pairs: needs pairs
clipping (fig 8)                  none: keeping negatives can only lower SyncR²; the size is the finding
sample size (fig 9)               none: the run's size against the paper's
persona (table 2)                 each split averaged over its own seeds, a paired t-test over runs x directions, and the
                                  episode bootstrap of the difference: the larger p
nonlinear (table 5)               the episode bootstrap of the difference, and with two or more split seeds also the
                                  corrected re-split t-test of the paired differences: the larger p
ToM (fig 11)                      per decoder, corrected re-split t-test of baseline minus decoder KL
judge (table 4, fig 10)           the measured judges on published human ratings (a benchmark)
================================  ======================================================================================
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from synclib import stats
from synclib.analysis import power
from synclib.analysis.results import load_ability_scores
from synclib.analysis.tables import clipping_summary
from synclib.judge import human
from synclib.judge.table import read_table
from synclib.paths import CLAIMS_FILE, display, in_repo
from synclib.stats import MIN_N_CORR
from synclib.tasks.scenarios import CLOSENESS_CODES, RELATIONSHIPS

__all__ = ["AGREES", "PARTLY", "DIFFERS", "CANNOT", "INCONCLUSIVE", "VERDICTS", "LEVEL", "EQUIVALENCE_MARGIN",
           "ASSUMED_PAPER_DIFFERENCE", "GENERALISES", "COLLAPSES", "LOWERS_BY", "PAPER_PAIRS", "Measure", "Claim",
           "RunTests", "CLAIMS", "evaluate", "test_tables", "summary", "write"]

#: what a run can find about a claim ("partly": one part of the claim holds, another not; "inconclusive": the raw p
#: and the Holm-adjusted p give different verdicts, the raw one written as its leaning, "inconclusive, leaning differs")
AGREES, PARTLY, DIFFERS, CANNOT, INCONCLUSIVE = "agrees", "partly", "differs", "cannot test", "inconclusive"
VERDICTS = (AGREES, PARTLY, DIFFERS, CANNOT, INCONCLUSIVE)
#: the level of every claim's test, after Holm's adjustment across the claims' tests
LEVEL = 0.05
#: a "largely unchanged" claim (tables 2, 5; figure 9's gain) can be spoken to where a change this large
#: (SyncR² or R²) is detected with 80 % power: the paper's own differences there are up to 0.05
EQUIVALENCE_MARGIN = 0.05
#: the genuine-passive SyncR² difference taken as the paper's (figure 4a prints no number): an assumption
ASSUMED_PAPER_DIFFERENCE = 0.1
#: ours (the paper gives no number): the maps "generalise" where in every ordered run the median layer pair keeps
#: at least ``kept`` of its training R² on the test rows and at least ``positive`` of the layer pairs test above 0
GENERALISES = {"kept": 0.5, "positive": 0.75}
#: ours (the paper gives no number): a control "collapses" (the lags) and synchrony "crucially depends" on taking
#: part (the passive reader) where the control is below genuine by the claims' test and its SyncR² on the rows it
#: shares with genuine is at most this quantile of genuine's surrogate partners (figure 2's null, dialogs that never
#: met): below genuine but above that null, the claim holds only partly
COLLAPSES = 0.95
#: ours: keeping negative R² "lowers" SyncR² where the mean over pairs falls by more than this
LOWERS_BY = 0.005
#: model pairs in the paper's figure 6
PAPER_PAIRS = 21


@dataclass(frozen=True)
class Measure:
    """A number a claim's verdict rests on: what it is, its value, its 95 % interval and its p."""

    quantity: str              # "gap to passive" (genuine minus the passive reader)
    value: float
    lo: float = math.nan
    hi: float = math.nan
    p: float = math.nan        # the p-value that counts, where there is a test
    digits: int = 3
    label: str = ""            # which of a claim's numbers (e.g. "lag1"), where it has several
    unit: str = ""             # "SyncR²", "test R²"; "" for a correlation
    p_holm: float = math.nan   # p adjusted by Holm across the claims' tests


@dataclass
class Claim:
    """What a run says about one claim of the paper (module doc)."""

    verdict: str
    reason: str
    measures: tuple = ()
    numbers: dict = field(default_factory=dict)
    leaning: str = ""          # an inconclusive verdict's: the verdict at the raw p

    @property
    def shown(self) -> str:
        """The verdict as the pages print it: ``"inconclusive, leaning differs"`` where it is inconclusive."""
        return f"{self.verdict}, leaning {self.leaning}" if self.verdict == INCONCLUSIVE else self.verdict


def _row(d) -> dict:
    """A test's dict or table row without its arrays, as plain numbers."""
    return {k: v for k, v in dict(d).items() if not isinstance(v, np.ndarray)}


class RunTests:
    """One run's tests, each computed once (shared by the claims and :func:`test_tables`); the optional files (table
    1's abilities, table 4's human ratings and judge scores) are relative to the repository or absolute."""

    def __init__(self, res, published: dict, ability_scores=None, ratings=None, judge_scores=None):
        self.res, self.published = res, published
        self.ability_scores, self.ratings, self.judge_scores = ability_scores, ratings, judge_scores
        self.holm: dict = {}

    def significant(self, p: float) -> bool:
        """Whether a claim's test rejects at :data:`LEVEL`, by its Holm-adjusted p once :func:`evaluate` has it."""
        return bool(np.isfinite(p) and self.holm.get(float(p), p) < LEVEL)

    @cached_property
    def controls(self) -> pd.DataFrame:
        return power.paired_control_tests(self.res)

    @cached_property
    def controls_seed_average(self) -> pd.DataFrame:
        return power.paired_control_tests(self.res, unit="direction")

    @cached_property
    def surrogates(self) -> dict:
        return power.surrogate_test(self.res)

    @cached_property
    def surrogates_persona(self) -> dict:
        return power.surrogate_test(self.res, split="persona")

    @cached_property
    def pairs(self) -> pd.DataFrame:
        return self.res.pair_table()

    @cached_property
    def topk_correlations(self) -> pd.DataFrame:
        """Figure 7: Pearson r of top-k SyncR² with social performance per family and k."""
        social = self.res.social_table().set_index("pair")["social"]
        topk = self.res.topk_table()
        topk["social"] = topk["pair"].map(social)
        rows = []
        for k, sub in topk.groupby("k"):
            for _, c in stats.correlations_by_group(sub, "social", "mean", by="family").iterrows():
                rows.append({"group": c["group"], "k": int(k), "n": int(c["n"]), "r": c["r"], "p": c["p"],
                             "significant": bool(c["p"] < 0.05) if np.isfinite(c["p"]) else False,
                             "reason": c["reason"]})
        return pd.DataFrame(rows, columns=["group", "k", "n", "r", "p", "significant", "reason"])

    @cached_property
    def abilities(self) -> pd.DataFrame | None:
        """Table 1's per-pair data (:meth:`~synclib.analysis.tables.Tables.ability_table`), None without scores."""
        return None if not self.ability_scores else self.res.ability_table(load_ability_scores(self.ability_scores))

    @cached_property
    def tom(self) -> pd.DataFrame:
        return power.tom_tests(self.res)


# --------------------------------------------------------------------------- the claims
def synchrony(t: RunTests) -> Claim:
    """Figure 2: the maps predict the partner's next state beyond what dialogs that never met share
    (SyncR² is above 0 for unrelated states too, so 0 is no null), and they generalise.  The numbers also hold the
    same test under the persona-disjoint split (``surrogates_persona``; not part of the verdict)."""
    sync, s = t.res.sync_table(), t.surrogates
    nums = {"pairs": sync[["pair", "mean"]].to_dict("records"), "surrogates": _row(s),
            "surrogates_persona": _row(t.surrogates_persona)}
    if not np.isfinite(sync["mean"]).any():
        return Claim(CANNOT, "no-genuine", (), nums)
    if not s["n_surrogates"]:
        return Claim(CANNOT, "no-surrogates", (), nums)
    m = (Measure("gap to surrogate partners", s["gap"], s["ci_lo"], s["ci_hi"], s["p"], unit="SyncR²"),)
    if t.significant(s["p"]) and s["gap"] > 0:
        g = t.res.generalisation_summary()
        if g.empty:
            return Claim(PARTLY, "generalisation-untested", m, nums)
        kept = g["test_median"] / g["train_median"]
        nums["generalisation"] = g.assign(kept=kept).to_dict("records")
        ok = bool(((kept >= GENERALISES["kept"]) & (g["share_positive"] >= GENERALISES["positive"])).all())
        return Claim(AGREES if ok else PARTLY, "generalises" if ok else "not-generalise", m, nums)
    if s["p_floor"] >= LEVEL or (s["gap"] > 0 and s["p"] <= s["p_floor"]):
        # the rank test at its floor (genuine above every surrogate) and still not significant (after Holm's
        # adjustment): more surrogates would be needed, nothing says genuine is not above them
        return Claim(CANNOT, "floor", m, nums)
    return Claim(DIFFERS, "not-above", m, nums)


def _control(t: RunTests, control: str, paper_difference: float | None, collapse: bool = False) -> Claim:
    """Genuine against ``control`` on the rows both hold: above, below, or why not tested; with ``collapse``, genuine
    above the control agrees only where the control falls into the surrogate null (:data:`COLLAPSES`)."""
    rows = t.controls[t.controls["control"] == control] if len(t.controls) else t.controls
    if not len(rows):
        return Claim(CANNOT, "absent")
    r = rows.iloc[0]
    nums = {**_row(r), "difference": power.reported_difference(r), "paper_difference": paper_difference,
            "n_needed": power.n_pairs_needed(paper_difference, r["sd_diff"]) if paper_difference else None}
    if int(r["n_pairs"]) < 2:
        return Claim(CANNOT, "few-values", (), nums)
    if not np.isfinite(r["mde"]):
        return Claim(CANNOT, "equal" if r["mean_diff"] == 0 else "constant", (), nums)
    m = (Measure(f"gap to {control}", nums["difference"], r.get("ci_lo", math.nan), r.get("ci_hi", math.nan),
                 r["p"], label=control, unit="SyncR²"),)
    if t.significant(r["p"]) and nums["difference"] > 0 and collapse:
        s = t.surrogates
        own = r.get("sync_control", math.nan)
        nums["control_value"] = own if np.isfinite(own) else r["mean_control"]
        if not s["n_surrogates"]:
            return Claim(PARTLY, "above-no-null", m, nums)
        nums["null_quantile"] = float(np.nanquantile(s["surrogates"], COLLAPSES))
        into = nums["control_value"] <= nums["null_quantile"]
        return Claim(AGREES if into else PARTLY, "collapses" if into else "above-null", m, nums)
    if t.significant(r["p"]):
        return Claim(AGREES if nums["difference"] > 0 else DIFFERS,
                     "above" if nums["difference"] > 0 else "below", m, nums)
    if paper_difference is not None and np.isfinite(r["mde_corrected"]) and r["mde_corrected"] <= paper_difference:
        return Claim(DIFFERS, "not-found-powered", m, nums)
    return Claim(CANNOT, "not-detected", m, nums)


def passive(t: RunTests) -> Claim:
    """Figures 3-4a: synchrony crucially depends on taking part: the passive reader (the paper's code's, another
    persona) falls below genuine into the surrogate null (:data:`COLLAPSES`)."""
    return _control(t, "passive", ASSUMED_PAPER_DIFFERENCE, collapse=True)


def passive_own(t: RunTests) -> Claim:
    """Ours: the passive reader told it is the agent it replaces below genuine: taking part alone."""
    return _control(t, "passive_own", None)


def lags(t: RunTests) -> Claim:
    """Figures 3-4b: synchrony collapses at lags 1 and 2: every lag below genuine, into the surrogate null
    (:data:`COLLAPSES`); all below but some above the null: partly."""
    names = [c for c in t.controls["control"] if c.startswith("lag")] if len(t.controls) else []
    if not names:
        return Claim(CANNOT, "absent")
    parts = [_control(t, c, None, collapse=True) for c in names]
    verdict = (AGREES if all(p.verdict == AGREES for p in parts) else
               DIFFERS if any(p.verdict == DIFFERS for p in parts) else
               PARTLY if all(p.verdict in (AGREES, PARTLY) for p in parts) else CANNOT)
    nums = {"lags": [{"control": c, "verdict": p.verdict, "reason": p.reason, **p.numbers}
                     for c, p in zip(names, parts)]}
    return Claim(verdict, "each-lag", tuple(m for p in parts for m in p.measures), nums)


def shuffled(t: RunTests) -> Claim:
    """The paper's code's shuffled control below genuine (the paper does not report it)."""
    return _control(t, "shuffled", None)


def pseudo(t: RunTests) -> Claim:
    """Ours: pseudo-dyads, agents of another conversation (of the same task where the run has two seeds), below
    genuine."""
    return _control(t, "pseudo", None)


def relationships(t: RunTests) -> Claim:
    """Figure 5: SyncR² rises with closeness, over the categories every model pair has (each the mean of
    the pairs' means: its test subsets share its scenarios, so the category is the unit)."""
    table = t.res.relationship_table()
    if table.empty:
        return Claim(CANNOT, "no-values" if table.attrs.get("present") else "absent")
    per = t.res.closeness_means(table)
    means = per.dropna().mean(axis=1)
    c = stats.pearson(means.index.to_numpy(float), means.to_numpy(float))
    within = {pair: dataclasses.asdict(stats.pearson(col.dropna().index.to_numpy(float), col.dropna().to_numpy(float)))
              for pair, col in per.items()}
    five = {RELATIONSHIPS[k] for k in CLOSENESS_CODES}
    every = t.res.relationship_scenarios()
    nums = {"r": c.r, "p": c.p, "n": c.n, "reason_r": c.reason, "within": within,
            "scenarios": {k: v for k, v in every.items() if k in five},
            "other_scenarios": {k: v for k, v in every.items() if k not in five},
            "all_scenarios": t.res.relationship_scenarios(with_values=False)}
    m = (Measure(f"Pearson r over {c.n} categories", c.r, p=c.p, digits=2),) if c.ok else ()
    if any(v < 3 for v in nums["scenarios"].values()):
        return Claim(CANNOT, "confounded", m, nums)
    if c.n < MIN_N_CORR + 2:
        return Claim(CANNOT, "few-categories", m, nums)
    positive = c.ok and c.r > 0 and t.significant(c.p)
    return Claim(AGREES if positive else DIFFERS, "positive" if positive else "no-positive", m, nums)


def _enough_pairs(t: RunTests) -> tuple[bool, dict]:
    n = len(t.res.pair_names)
    return n >= MIN_N_CORR + 2, {"n_pairs": n, "paper_pairs": PAPER_PAIRS}


def social(t: RunTests) -> Claim:
    """Figure 6 and table 1: SyncR² tracks social performance (a correlation over model pairs)."""
    enough, nums = _enough_pairs(t)
    if not enough:
        return Claim(CANNOT, "few-pairs", (), nums)
    c = stats.pearson(t.pairs["sync"], t.pairs["social"])
    nums.update(r=c.r, p=c.p, n=c.n, reason_r=c.reason)
    if not c.ok:
        return Claim(CANNOT, "no-r", (), nums)
    return Claim(AGREES if c.r > 0 and t.significant(c.p) else DIFFERS, "correlation", (), nums)


def topk(t: RunTests) -> Claim:
    """Figure 7: the correlation with social performance holds for every top-k."""
    enough, nums = _enough_pairs(t)
    if not enough:
        return Claim(CANNOT, "few-pairs", (), nums)
    c = t.topk_correlations
    c = c[np.isfinite(c["r"].astype(float))] if len(c) else c
    if c.empty:
        return Claim(CANNOT, "no-r", (), nums)
    nums.update(held=int((c["significant"] & (c["r"] > 0)).sum()), n_correlations=len(c))
    return Claim(AGREES if nums["held"] == len(c) else DIFFERS, "correlations", (), nums)


def clipping(t: RunTests) -> Claim:
    """Figure 8: keeping negative R² lowers SyncR² (a fall of more than :data:`LOWERS_BY`) and inflates its
    standard error; no test: the unclipped value can never exceed the clipped one."""
    table = t.res.clipping_table()
    paper = table[table["penalty"] == "paper"] if len(table) else table
    if paper.empty:
        return Claim(CANNOT, "absent")
    s = clipping_summary(paper)
    nums = {"paper": s, "lowers_by": LOWERS_BY}
    if not s["n_pairs"]:
        return Claim(CANNOT, "no-values", (), nums)
    lowers = s["clipped"] - s["kept"] > LOWERS_BY
    own = table[table["penalty"] == "run"]
    o = clipping_summary(own) if len(own) else None
    if o is not None and np.isfinite(o["clipped"]):
        nums["run"] = o
        own_lowers = o["clipped"] - o["kept"] > LOWERS_BY
        if lowers != own_lowers:
            return Claim(PARTLY, "paper-penalty-only" if lowers else "run-penalty-only", (), nums)
    return Claim(AGREES if lowers else DIFFERS, "lowers" if lowers else "not-lowers", (), nums)


def sample_size(t: RunTests) -> Claim:
    """Figure 9: little gain beyond the paper's samples per dataset (less than :data:`EQUIVALENCE_MARGIN`)."""
    paper_n = t.published.get("fig9", {}).get("n_samples", 6500)
    counts = t.res.sample_counts()
    if counts[counts["condition"] == "genuine"].empty:
        return Claim(CANNOT, "no-split" if t.res.runs_with("n_train") else "no-counts", (),
                     {"paper_n": paper_n})
    sizes = t.res.dataset_sizes()
    nums = {"sizes": sizes, "paper_n": paper_n}
    if max(sizes.values()) < paper_n:
        return Claim(CANNOT, "smaller-than-paper", (), nums)
    curve = t.res.sample_size_table()
    gain = (curve.groupby("pair")["mean"].last()
            - curve[curve["n_samples"] <= paper_n].groupby("pair")["mean"].last()).dropna()
    if gain.empty:
        return Claim(CANNOT, "no-sweep-point", (), nums)
    nums["gain"] = float(gain.max())
    return Claim(AGREES if gain.max() < EQUIVALENCE_MARGIN else DIFFERS, "gain", (), nums)


#: the settings tables 2 and 5 test: (the name of the difference, its unit, whether the paper finds the
#: setting only no better, so that a significant fall agrees)
_SETTINGS = {"persona": ("persona-disjoint − original", "SyncR²", False),
             "nonlinear": ("MLP − affine map", "test R²", True)}


def _setting(t: RunTests, setting: str) -> Claim:
    """Tables 2 and 5: the setting about the same as the original.  Agrees where a change of
    :data:`EQUIVALENCE_MARGIN` would be detected and none (or, one-sided, a fall) is; differs on a significant one."""
    name, unit, one_sided = _SETTINGS[setting]
    d = power.setting_test(t.res, setting)
    nums = {**_row(d), "quantity": power.SETTINGS[setting][2], "margin": EQUIVALENCE_MARGIN}
    if d["n"] < 2:
        return Claim(CANNOT, "few-values" if t.res.runs_with(power.SETTINGS[setting][0]) else "absent", (), nums)
    if setting == "nonlinear" and d["n_seeds"] < 2 and not d.get("n_boot"):  # one split seed, no resamples: no test
        return Claim(CANNOT, "one-seed", (Measure(name, d["mean"], unit=unit),), nums)
    # table 5's episode interval is around its own mean; table 2's is around the surrogate rows' difference
    lo, hi = (d.get("ci_lo", math.nan), d.get("ci_hi", math.nan)) if setting == "nonlinear" else (math.nan, math.nan)
    m = (Measure(name, d["mean"], lo=lo, hi=hi, p=d["p"], unit=unit),)
    found = t.significant(d["p"])
    if found and (d["mean"] > 0 if one_sided else True):
        return Claim(DIFFERS, "difference", m, nums)
    if found:
        return Claim(AGREES, "worse", m, nums)
    powered = bool(np.isfinite(d["mde"]) and d["mde"] <= EQUIVALENCE_MARGIN)
    return Claim(AGREES if powered else CANNOT, "none-found-powered" if powered else "underpowered", m, nums)


def persona(t: RunTests) -> Claim:
    """Table 2: SyncR² is largely unchanged with a persona-disjoint split."""
    return _setting(t, "persona")


def nonlinear(t: RunTests) -> Claim:
    """Table 5: nonlinear maps capture no more than affine ones."""
    return _setting(t, "nonlinear")


def tom(t: RunTests) -> Claim:
    """Figure 11: emotions and actions of self and partner decode above the train-mean baseline (each
    decoder's test at p < 0.05, unadjusted)."""
    d = t.tom
    if d.empty:
        return Claim(CANNOT, "absent")
    if not np.isfinite(d["mean"].astype(float)).any():
        return Claim(CANNOT, "no-decoder")
    nums = {"decoders": len(d), "above": int(((d["p"] < 0.05) & (d["mean"] > 0)).sum())}
    if not bool(d["format_followed"].all()):  # the paper decodes replies in the instructed format only
        return Claim(CANNOT, "format-not-followed", (), nums)
    return Claim(AGREES if nums["above"] else DIFFERS, "decoders", (), nums)


def judge(t: RunTests) -> Claim:
    """Table 4 and figure 10: the paper's judge (gpt-oss-120b), not run here, agrees with human ratings; the
    benchmark measures other judges on published ratings."""
    measured = human.load_measured() or {"judges": []}
    nums = {"judges": [{"judge": j["judge"], "episodes": j["episodes"],
                        "r": [d["r"] for d in j["dimensions"] if d["r"] is not None and np.isfinite(d["r"])]}
                       for j in measured["judges"]]}
    return Claim(CANNOT, "not-run", (), nums)


#: every claim of the paper, in the paper's order: (function, the page that shows it, its
#: data/published.json keys, the claim in short with where the paper makes it)
CLAIMS = (
    (synchrony, "fig02_heatmaps", ("fig2",),
     "Synchrony: the maps predict the partner's next state and generalise (section 3.2, figure 2; section 6)"),
    (passive, "fig03_04_controls", ("fig3_4",),
     "Synchrony crucially depends on taking part: the passive reader falls to the surrogate null (section 4.2, "
     "figure 4a)"),
    (passive_own, "fig03_04_controls", ("fig3_4",),
     "The passive reader told it is the agent it replaces below genuine: taking part alone (ours; not in the paper)"),
    (lags, "fig03_04_controls", ("fig3_4",),
     "Synchrony collapses at lags k = 1, 2: to the surrogate null (section 4.2, figure 4b)"),
    (shuffled, "fig03_04_controls", ("fig3_4",),
     "The paper's code's shuffled control below genuine (not reported in the paper)"),
    (pseudo, "fig03_04_controls", ("fig3_4",),
     "Pseudo-dyads, agents of another conversation, below genuine (ours; not in the paper)"),
    (relationships, "fig05_relationship", ("fig5",), "SyncR² rises with relationship closeness (section 4.3, figure 5)"),
    (social, "fig06_table1_social", ("fig6", "table1"),
     "SyncR² tracks social performance, also given IFEval and MuSR (section 5, figure 6, table 1)"),
    (topk, "fig07_topk", ("fig7",), "The correlation holds for every top-k (appendix C.1, figure 7)"),
    (clipping, "fig08_clipping", ("fig8",),
     "Keeping negative R² lowers SyncR² and inflates its standard error (appendix C.2, figure 8)"),
    (sample_size, "fig09_sample_size", ("fig9",), "Little gain beyond {n:,} samples per dataset (appendix D, figure 9)"),
    (persona, "table2_persona_disjoint", ("table2",),
     "SyncR² unchanged with a persona-disjoint split (appendix E, table 2)"),
    (judge, "table4_fig10_judge_human", ("table4", "fig10"),
     "The paper's judge (gpt-oss-120b) agrees with human ratings (appendix H, table 4, figure 10)"),
    (nonlinear, "table5_nonlinear", ("table5",), "Nonlinear maps no better overall than affine ones (appendix I, table 5)"),
    (tom, "fig11_tom", ("fig11",), "Emotions and actions decode above the baseline (appendix J, figure 11)"),
)


def evaluate(t: RunTests) -> list[Claim]:
    """Every claim of :data:`CLAIMS` on ``t``'s run: once at the tests' raw p-values, then again with each
    verdict read at its p after Holm's adjustment across all of them; the measures get ``p_holm``.  A claim whose
    two verdicts differ is :data:`INCONCLUSIVE`, leaning to its verdict at the raw p (unless that is :data:`CANNOT`):
    table 2's fall at raw p 0.02 and Holm's 0.06 reads "inconclusive, leaning differs", not "cannot test"."""
    t.holm = {}
    raw = [fn(t) for fn, *_ in CLAIMS]
    ps = [m.p for c in raw for m in c.measures if np.isfinite(m.p)]
    table: dict = {}
    for p, a in zip(ps, stats.holm(np.asarray(ps, dtype=float))):
        table[float(p)] = max(a, table.get(float(p), 0.0))
    t.holm = table
    out = [fn(t) for fn, *_ in CLAIMS]
    for c, r in zip(out, raw):
        c.measures = tuple(dataclasses.replace(m, p_holm=table.get(float(m.p), math.nan)) for m in c.measures)
        if c.verdict != r.verdict and r.verdict != CANNOT:
            c.verdict, c.leaning = INCONCLUSIVE, r.verdict
    return out


# --------------------------------------------------------------------------- the pages' tables of tests
def _trends(res) -> pd.DataFrame:
    """The trend of SyncR² over the rounds per pair and condition (:meth:`~synclib.analysis.tables.Tables.round_trends`)
    with its 95 % interval and two-sided p over the episode resamples, and ``p_holm`` over every row."""
    rows = []
    for r in res.round_trends():
        draws = r.pop("draws")
        r.update(ci_lo=math.nan, ci_hi=math.nan, p=math.nan, n_boot=0)
        if draws is not None:
            lo, hi = stats.bca_interval(draws, r["slope"], r["n_episodes"])
            r.update(ci_lo=lo, ci_hi=hi, p=stats.bootstrap_p(draws), n_boot=int(np.isfinite(draws).sum()))
        rows.append(r)
    out = pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders", "condition", "slope", "ci_lo",
                                      "ci_hi", "p", "p_holm", "n_rounds", "first_round", "last_round", "first", "last",
                                      "n_boot", "n_episodes"])
    out["p_holm"] = stats.holm(out["p"].to_numpy(float)) if len(out) else out["p"]
    return out


def _intervals(res) -> pd.DataFrame:
    """The reported SyncR² of every condition per ordered run and per pair, with its 95 % interval over
    resampled episodes (:func:`synclib.analysis.power.episode_interval`); the surrogates' mean and range."""
    rows = []
    units = [(r.name, "run", [r.name], [str(c) for c in res.analysis(r.name)["condition"].values])
             for r in res.runs] + [(p, "pair", [r.name for r in res.runs_of(p)], res.conditions()) for p in res.pair_names]
    for name, kind, runs, conditions in units:
        for cond in conditions:
            rows.append({"unit": name, "kind": kind, "condition": cond,
                         **_row(power.episode_interval(res, cond, runs=runs))})
        s = power.surrogate_test(res, runs)
        if s["n_surrogates"]:
            ok = np.asarray(s["surrogates"], dtype=float)
            ok = ok[np.isfinite(ok)]
            rows.append({"unit": name, "kind": kind, "condition": "surrogates", "value": s["surrogate_mean"],
                         "ci_lo": float(ok.min()), "ci_hi": float(ok.max()), "n_boot": 0})
    return pd.DataFrame(rows)


def _surrogate_values(res) -> pd.DataFrame:
    """Per pair, each surrogate's SyncR² and genuine's on the same rows (figure 2's null, drawn)."""
    rows = []
    for p in res.pair_names:
        s = power.surrogate_test(res, [r.name for r in res.runs_of(p)])
        if s["n_runs"]:
            rows += [{"pair": p, "kind": "surrogate", "surrogate": m, "value": float(v)}
                     for m, v in enumerate(s["surrogates"]) if np.isfinite(v)]
            rows.append({"pair": p, "kind": "genuine", "surrogate": -1, "value": s["genuine"]})
    return pd.DataFrame(rows, columns=["pair", "kind", "surrogate", "value"])


def _partial(pairs: pd.DataFrame) -> pd.DataFrame:
    """Table 1: per family and pooled, the partial r of SyncR² and social performance given each ability."""
    rows = []
    for name, sub in list(pairs.groupby("family", sort=False)) + [("All pairs", pairs)]:
        row = {"family": name, "n": int(sub[["sync", "social"]].dropna().shape[0])}
        for m in ("ifeval", "musr"):
            c = stats.partial_pearson(sub, "sync", "social", m)
            row.update({m: c.r, f"{m} p": c.p, f"{m} n": c.n, f"{m} reason": c.reason})
        rows.append(row)
    return pd.DataFrame(rows)


def _judge_human(ratings, judge_scores) -> dict:
    """Table 4 and figure 10 for the judge of ``judge_scores`` against the human ``ratings`` (both files
    or neither): per dimension r, p, n; the differences; the share within one standard deviation."""
    if (ratings is None) != (judge_scores is None):
        raise ValueError("give both notebooks.human_ratings and notebooks.human_judge_scores, or neither")
    if ratings is None:
        return {}
    table = read_table(in_repo(judge_scores))
    if "episode_id" not in table.columns:
        raise ValueError(f"notebooks.human_judge_scores = {judge_scores!r} has no episode_id column: judge the "
                         "rated episodes file (synclib evaluate EPISODES.jsonl)")
    ratings_table = human.read_ratings(in_repo(ratings), episode_ids=set(table["episode_id"].astype(str)))
    paired = human.paired_scores(table, ratings_table)
    diffs = human.differences(paired)
    return {"agreement": human.agreement(paired), "differences": diffs,
            "summary": pd.DataFrame([{"judge": ", ".join(sorted(set(table["judge"]))) or "the judge",
                                      "share_within": human.within_share(diffs),
                                      "episodes_rated": ratings_table["episode_id"].nunique(),
                                      "ratings": len(ratings_table),
                                      "raters": max(ratings_table["rater"].nunique(), 1),
                                      "paired": len(paired)}]),
            "coverage": pd.DataFrame([human.episode_coverage(table, ratings_table)])}


def test_tables(t: RunTests) -> dict[str, pd.DataFrame]:
    """The tables of tests the pages show, by name: ``controls`` pairs every control with genuine by run, direction
    and split seed (:func:`synclib.analysis.power.paired_control_tests`; ``controls_seed_average`` averages the seeds
    first); ``surrogates`` is per pair and over all; ``judged_runs`` asks whether the runs' judged scores differ;
    ``social_correlations`` is figure 6's, ``partial`` and ``abilities`` table 1's, ``tom`` figure 11's; ``planted``
    the power curve; ``cka_null`` genuine's debiased CKA against its permutation null, and each control beside
    genuine on the rows both hold, per pair (:meth:`~synclib.analysis.tables.Tables.cka_null_table`);
    ``judge_human_*`` (with human ratings) table 4's."""
    res = t.res
    scores = res.dialog_scores()
    judged = stats.compare_groups(scores, "score", "run") if scores["run"].nunique() > 1 else None
    social = stats.correlations_by_group(t.pairs, "sync", "social")
    planted = power.planted_power(res)
    planted.attrs["detection_size"] = power.detection_size(planted) if len(planted) else None
    tables = {"controls": t.controls, "controls_seed_average": t.controls_seed_average,
              "controls_by_run": power.paired_tests_by_run(res), "surrogates": power.surrogate_table(res),
              "surrogate_values": _surrogate_values(res), "intervals": _intervals(res), "trends": _trends(res),
              "social_correlations": social.drop(columns="text"),
              "judged_runs": pd.DataFrame([{"test": judged["name"], "p": judged["p"]}] if judged else []),
              "partial": _partial(t.abilities) if t.abilities is not None else pd.DataFrame(),
              "abilities": t.abilities if t.abilities is not None else pd.DataFrame(),
              "topk_correlations": t.topk_correlations, "tom": t.tom, "planted": planted,
              "cka_null": res.cka_null_table()}
    tables.update({f"judge_human_{k}": v for k, v in _judge_human(t.ratings, t.judge_scores).items()})
    return tables


# --------------------------------------------------------------------------- the file
def _plain(x):
    """``x`` for JSON: numpy scalars and arrays as Python numbers and lists."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return [_plain(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, pd.DataFrame):
        return {"columns": [str(c) for c in x.columns], "rows": _plain(x.to_dict("records")),
                "attrs": _plain(dict(x.attrs))}
    return x


def summary(t: RunTests) -> dict:
    """``claims.json``'s content (module doc) for ``t``'s run."""
    paper_n = t.published.get("fig9", {}).get("n_samples", 6500)
    claims = []
    for (fn, page, keys, what), c in zip(CLAIMS, evaluate(t)):
        claims.append({"id": fn.__name__, "page": page, "keys": list(keys), "what": what.format(n=paper_n),
                       "verdict": c.shown, "leaning": c.leaning, "reason": c.reason, "measures": [dataclasses.asdict(m) for m in c.measures],
                       "numbers": c.numbers})
    return _plain({"claims": claims, "level": LEVEL,
                   "n_claim_tests": sum(bool(np.isfinite(m["p"])) for c in claims for m in c["measures"]),
                   "inputs": {k: display(v) if v else None for k, v in (("ability_scores", t.ability_scores),
                                                                        ("ratings", t.ratings),
                                                                        ("judge_scores", t.judge_scores))},
                   "tests": test_tables(t)})


def write(res, published: dict, **files) -> Path:
    """Judge every claim on ``res`` and write :func:`summary` to its ``claims.json`` (atomically)."""
    path = res.root / CLAIMS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary(RunTests(res, published, **files)), indent=1))
    tmp.replace(path)
    return path
