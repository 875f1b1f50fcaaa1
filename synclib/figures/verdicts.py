"""What a run can say about a claim of the paper: the verdict vocabulary and the wording shared by figures.

Each figure's module (:mod:`synclib.figures`) owns its claims; this module holds what they share:
:class:`Claim` (with the :class:`Measure` its verdict rests on, for the first page's scorecard),
:data:`VERDICTS`, the link from a claim's p to the one description of its test on the power page
(:func:`test_link`, :func:`p_test`), how a line names the run (:func:`who`, :func:`tiny`), the
count of model pairs a correlation over pairs needs (:func:`pairs_text`) and the test of a
setting against the original (:func:`setting_claim`, tables 2 and 5).
"""
from __future__ import annotations

import contextvars
import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from synclib import stats
from synclib.analysis import power
from synclib.stats import MIN_N_CORR
from synclib.stats import fmt as _f
from synclib.stats import p_clause as _p

__all__ = ["Claim", "Measure", "VERDICTS", "TEST_LABEL", "test_link", "p_test", "AGREES", "PARTLY", "DIFFERS",
           "CANNOT", "LEVEL", "adjusted", "significant", "PAPER_PAIRS", "EQUIVALENCE_MARGIN", "who", "tiny",
           "pairs_text", "setting_claim", "evaluate", "holm_table", "n_claim_tests", "page_lines"]

#: what a run can find about a claim of the paper ("partly": one part of the claim holds, another not)
AGREES, PARTLY, DIFFERS, CANNOT = "agrees", "partly", "differs", "cannot test"
VERDICTS = (AGREES, PARTLY, DIFFERS, CANNOT)
#: the level of every claim's test, after Holm's adjustment across the claims' tests (:func:`evaluate`)
LEVEL = 0.05
#: while :func:`evaluate` judges the claims a second time: each claim test's p -> its Holm-adjusted p
_HOLM: contextvars.ContextVar = contextvars.ContextVar("synclib_holm", default=None)


def adjusted(p: float) -> float:
    """``p`` after Holm's adjustment across the claims' tests while :func:`evaluate` judges them;
    ``p`` itself otherwise (a claim evaluated on its own, or a p that is not a claim's test)."""
    table = _HOLM.get()
    return table.get(float(p), p) if table else p


def significant(p: float, level: float = LEVEL) -> bool:
    """Whether a claim's test rejects at ``level``, by its Holm-adjusted p (:func:`adjusted`)."""
    return bool(np.isfinite(p) and adjusted(p) < level)

#: model pairs in the paper's figure 6
PAPER_PAIRS = 21
#: the scorecard's name and unit of a setting's difference (:data:`synclib.analysis.power.SETTINGS`)
SETTING_MEASURES = {"persona": ("persona-disjoint − original", "SyncR²"), "nonlinear": ("MLP − affine map", "test R²")}
#: a "largely unchanged" claim (tables 2, 5) can be spoken to when the test detects a change this
#: large (SyncR² or R²) with 80 % power: the paper's own differences there are up to 0.05
EQUIVALENCE_MARGIN = 0.05


#: the label of the power page's section that describes, once and in full, the tests the claims
#: quote (``(claims-test)=`` in notebooks/power.md); a claim's line links to it as "test"
TEST_LABEL = "claims-test"


def test_link(word: str = "test") -> str:
    """MyST: a link to the power page's description of the tests (:data:`TEST_LABEL`); it resolves
    from every page, the first page's included run summary and a figure page's printed Markdown alike."""
    return f"[{word}](#{TEST_LABEL})"


def p_test(p: float, word: str = "test") -> str:
    """``"p = 0.0042 ([test](#claims-test))"``: the p-value that counts, linked to its test's description;
    while :func:`evaluate` adjusts the claims' tests, with its Holm-adjusted value
    (``"p = 0.033, Holm-adjusted 0.39 (test)"``)."""
    return f"{_p(p)}{_holm_clause(p)} ({test_link(word)})"


def _holm_clause(p: float) -> str:
    """``", Holm-adjusted 0.39"`` while :func:`evaluate` adjusts the claims' tests and ``p`` is one of them."""
    a = adjusted(p)
    return f", Holm-adjusted {_f(a, 2 if a >= 0.01 else 3)}" if _HOLM.get() and np.isfinite(p) and a != p else ""


@dataclass(frozen=True)
class Measure:
    """A number a claim's verdict rests on, as the first page's scorecard shows it
    (:mod:`synclib.figures.scorecard`): the same number the claim's line quotes."""

    quantity: str              # what it is: "gap to passive" (genuine minus the passive reader)
    value: float
    lo: float = math.nan       # its 95 % interval (e.g. over resampled episodes), where the claim has one
    hi: float = math.nan
    p: float = math.nan        # the p-value that counts, where there is a test
    digits: int = 3
    label: str = ""            # which of a claim's several numbers (e.g. "lag1"), where it has several
    unit: str = ""             # "SyncR²", "test R²"; "" for a correlation
    p_holm: float = math.nan   # ``p`` adjusted by Holm across the claims' tests (:func:`evaluate`)

    def value_text(self) -> str:
        """``"gap to passive 0.033 SyncR², p = 0.0042"``, with ``", Holm-adjusted 0.021"`` where adjusted."""
        unit = f" {self.unit}" if self.unit else ""
        p = f", {_p(self.p)}" if np.isfinite(self.p) else ""
        if np.isfinite(self.p_holm) and self.p_holm != self.p:
            p += f", Holm-adjusted {_f(self.p_holm, 2 if self.p_holm >= 0.01 else 3)}"
        return f"{self.quantity} {_f(self.value, self.digits)}{unit}{p}"

    def interval_text(self) -> str:
        """``"0.012 to 0.055"``, or ``"—"`` where the claim has no interval."""
        if not (np.isfinite(self.lo) and np.isfinite(self.hi)):
            return "—"
        return f"{_f(self.lo, self.digits)} to {_f(self.hi, self.digits)}"


@dataclass
class Claim:
    """What a run says about one claim of the paper."""

    key: str       # its entry in data/published.json
    what: str      # the claim, short, with where the paper makes it
    verdict: str   # one of VERDICTS: "agrees", "partly", "differs" or "cannot test"
    text: str      # the effect, the test and p, or why the run cannot test it
    measures: tuple = ()  # the numbers the verdict rests on (Measure), for the scorecard; () where none

    def line(self) -> str:
        """Markdown: ``what: **verdict**: text``."""
        return f"{self.what}: **{self.verdict}**: {self.text}"


def who(res) -> str:
    return "the embedded models show" if res.embedded else "this run shows"


def tiny(res) -> str:
    return " (the embedded tiny models, not the paper's)" if res.embedded else ""


def pairs_text(res) -> tuple[bool, str]:
    """Whether the run has enough model pairs for a correlation over them, and the count in words."""
    n = len(res.pair_names)
    enough = n >= MIN_N_CORR + 2
    note = "" if enough else " (a correlation over so few points is not evidence)"
    return enough, f"{n} model pair{'s' if n != 1 else ''} here, {PAPER_PAIRS} in the paper{note}{tiny(res)}"


def resplit_line(d: dict, quantity: str) -> str:
    seeds = d.get("n_seeds", 0)
    test = (f"{test_link('corrected t-test')} over {d['n']} paired values (runs x directions; one split seed, so "
            "no re-splits)" if seeds == 1 else
            f"{test_link('re-split test')} over {d['n']} paired values (runs x directions x {seeds} split seeds)"
            if seeds else f"{test_link('re-split test')} over {d['n']} paired values")
    return (f"{quantity} {_f(d['mean'], 3)} ({_p(d['p'])}{_holm_clause(d['p'])}, {test}; "
            f"detectable from about {_f(d['mde'], 3)})")


def setting_claim(res, key: str, setting: str, what: str, missing: str, one_sided: bool = False) -> Claim:
    """Tables 2 and 5: a setting against the original (:func:`synclib.analysis.power.setting_test`). The
    paper finds them about the same: a run agrees where it would detect a change of
    :data:`EQUIVALENCE_MARGIN` and finds none, differs where it finds one at Holm-adjusted p < 0.05 (with
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
    found = significant(d["p"])
    powered = bool(np.isfinite(d["mde"]) and d["mde"] <= EQUIVALENCE_MARGIN)
    # the paper finds the setting no better (table 5: the MLP) or unchanged (table 2)
    against = found and (d["mean"] > 0 if one_sided else True)
    line = resplit_line(d, quantity)
    name, unit = SETTING_MEASURES[setting]
    m = (Measure(name, d["mean"], p=d["p"], unit=unit),)
    if against:
        return Claim(key, what, DIFFERS, line + f"; {who(res)} a difference at (Holm-adjusted) p < 0.05.", m)
    if found:  # table 5: the MLP significantly worse than the affine map, which is no better
        return Claim(key, what, AGREES, line + f"; {who(res)} it below 0 at (Holm-adjusted) p < 0.05 (worse, so "
                                               "no better).", m)
    if powered:
        return Claim(key, what, AGREES, line + f"; a change of {EQUIVALENCE_MARGIN} or more would be detected, "
                                               "and none is.", m)
    return Claim(key, what, CANNOT, line + f"; a change of {EQUIVALENCE_MARGIN} (the paper's largest) would not be "
                                           "detected with 80 % power.", m)


def _judge(claims: tuple[tuple[Callable, str], ...], res, published: dict) -> list[Claim]:
    """Each function of ``claims`` once; those that read the paired tests of the controls (a
    ``table`` parameter) share one table of them."""
    fns = list(dict.fromkeys(f for f, _ in claims))
    reads = {f for f in fns if "table" in inspect.signature(f).parameters}
    table = power.paired_control_tests(res) if reads else None
    return [f(res, published, table=table) if f in reads else f(res, published) for f in fns]


def holm_table(res, published: dict) -> dict:
    """The p of every claim's test (the :class:`Measure` p of every claim of the paper,
    :func:`synclib.figures.claims`) -> its Holm-adjusted p across them all."""
    from synclib.figures import claims as every   # lazy: synclib.figures imports this module

    ps = [m.p for c in _judge(every(), res, published) for m in c.measures if np.isfinite(m.p)]
    table = {}
    for p, a in zip(ps, stats.holm(np.asarray(ps, dtype=float))):
        table[float(p)] = max(a, table.get(float(p), 0.0))
    return table


def evaluate(claims: tuple[tuple[Callable, str], ...], res, published: dict) -> list[Claim]:
    """Each function of ``claims`` on one run, its verdict by Holm's adjustment across the tests of
    every claim of the paper (:func:`holm_table`), whichever of them ``claims`` holds, so that a
    figure's page and the first page judge alike (:func:`significant`, :func:`p_test`); the adjusted
    p is recorded in the claims' measures (``p_holm``)."""
    adj = holm_table(res, published) if res is not None else {}  # None: claims that read no run (the judge's)
    token = _HOLM.set(adj)
    try:
        out = _judge(claims, res, published)
    finally:
        _HOLM.reset(token)
    for c in out:
        c.measures = tuple(dataclasses.replace(m, p_holm=adj.get(float(m.p), math.nan)) for m in c.measures)
    return out


def n_claim_tests(evaluated: list[Claim]) -> int:
    """How many tests :func:`evaluate` adjusted together (the claims' measures with a p)."""
    return sum(np.isfinite(m.p) for c in evaluated for m in c.measures)


def page_lines(claims: tuple[tuple[Callable, str], ...], res, published: dict) -> str:
    """Markdown for a figure's page: its claims' lines (a module's ``CLAIMS``) as the first page lists them."""
    lines = [c.line() for c in evaluate(claims, res, published)]
    return "**The paper's claim and this run** (as on the first page): " + " ".join(lines)
