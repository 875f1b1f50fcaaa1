"""What a run can say about a claim of the paper: the verdict vocabulary and the wording shared by figures.

Each figure's module (:mod:`synclib.figures`) owns its claims; this module holds what they share:
:class:`Claim`, :data:`VERDICTS`, how a line names the run (:func:`who`, :func:`tiny`), the count
of model pairs a correlation over pairs needs (:func:`pairs_text`) and the test of a setting
against the original (:func:`setting_claim`, tables 2 and 5).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np

from synclib.analysis import power
from synclib.stats import MIN_N_CORR
from synclib.stats import fmt as _f
from synclib.stats import p_clause as _p

__all__ = ["Claim", "VERDICTS", "AGREES", "DIFFERS", "CANNOT", "PAPER_PAIRS", "EQUIVALENCE_MARGIN", "who", "tiny",
           "pairs_text", "setting_claim", "evaluate", "page_lines"]

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
    return (f"{quantity} {_f(d['mean'], 3)} ({_p(d['p'])}, corrected re-split t-test over {d['n']} paired values; "
            f"detectable from about {_f(d['mde'], 3)})")


def setting_claim(res, key: str, setting: str, what: str, missing: str, one_sided: bool = False) -> Claim:
    """Tables 2 and 5: a setting against the original (:func:`synclib.analysis.power.setting_test`). The
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
    line = resplit_line(d, quantity)
    if against:
        return Claim(key, what, DIFFERS, line + f"; {who(res)} a difference at p < 0.05.")
    if found:  # table 5: the MLP significantly worse than the affine map, which is no better
        return Claim(key, what, AGREES, line + f"; {who(res)} it below 0 at p < 0.05 (worse, so no better).")
    if powered:
        return Claim(key, what, AGREES, line + f"; a change of {EQUIVALENCE_MARGIN} or more would be detected, "
                                               "and none is.")
    return Claim(key, what, CANNOT, line + f"; a change of {EQUIVALENCE_MARGIN} (the paper's largest) would not be "
                                           "detected with 80 % power.")


def evaluate(claims: tuple[tuple[Callable, str], ...], res, published: dict) -> list[Claim]:
    """Each function of ``claims`` once, on one run; the claims that read the paired tests of the
    controls (a ``table`` parameter) share one table of them."""
    fns = list(dict.fromkeys(f for f, _ in claims))
    reads = {f for f in fns if "table" in inspect.signature(f).parameters}
    table = power.paired_control_tests(res) if reads else None
    return [f(res, published, table=table) if f in reads else f(res, published) for f in fns]


def page_lines(claims: tuple[tuple[Callable, str], ...], res, published: dict) -> str:
    """Markdown for a figure's page: its claims' lines (a module's ``CLAIMS``) as the first page lists them."""
    lines = [c.line() for c in evaluate(claims, res, published)]
    return "**The paper's claim and this run** (as on the first page): " + " ".join(lines)
