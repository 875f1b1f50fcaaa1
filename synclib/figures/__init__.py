"""The book's figures: one module per notebook, named as the notebook.

A figure's module holds what its page shows: its tables (from :class:`synclib.analysis.results.Results`),
its charts, its sentences beside the paper's numbers and its claims of the paper (``CLAIMS``:
``(function, data/published.json key)`` pairs, each function returning a
:class:`~synclib.figures.verdicts.Claim`).  A student changing a figure opens the notebook
``notebooks/NAME.md`` and ``synclib/figures/NAME.py``, nothing else; what several figures share
lives beside them here (:mod:`~synclib.figures.verdicts`, the verdicts and their wording;
:mod:`~synclib.figures.charts`, the chart helpers).

:data:`FIGURES` lists the modules in the paper's order; :func:`claims` gathers every module's
claims through it, so the first page's list (:func:`claims_summary`) and each figure's page
(:func:`synclib.figures.verdicts.page_lines`) always agree.

The tests, and the statistical unit of each:

========================  ===============================================================
claim                     test
========================  ===============================================================
synchrony (fig 2)         genuine SyncR² against its surrogate partners (dialogs that never
                          met): the larger p of the rank among them and the episode
                          bootstrap of the gap (:func:`synclib.analysis.power.surrogate_test`);
                          "generalises" by a stated rule, no test (``GENERALISES``)
controls (figs 3-4, and   genuine against each control: the larger p of the corrected
our pseudo-dyads)         re-split t-test and the episode bootstrap
                          (:func:`synclib.analysis.power.paired_control_tests`)
relationships (fig 5)     Pearson r of closeness with the categories' SyncR² (the mean of
                          the pairs' means), over the categories every pair has (the unit:
                          a category's subsets share its scenarios); r within each pair beside
social (fig 6, table 1,   a correlation over model pairs: needs pairs
fig 7)
clipping (fig 8)          none: keeping negatives can only lower SyncR²; the size is the
                          finding, at the paper's penalty and at the run's own
sample size (fig 9)       none: the run's size against the paper's
persona split (table 2)   corrected re-split t-test of the per-seed differences
nonlinear (table 5)       corrected re-split t-test of the MLP's minus the affine map's
                          test R² on the same layer pairs
ToM (fig 11)              per decoder, corrected re-split t-test of baseline minus decoder
                          test KL
judge (table 4, fig 10)   the measured judges on published human ratings (benchmark)
========================  ===============================================================

A verdict that rests on a test reads its p after Holm's adjustment across the tests of every
claim (:func:`synclib.figures.verdicts.evaluate`).
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable

__all__ = ["FIGURES", "module", "claims", "claim", "claims_summary"]

#: the figure modules (and notebooks) in the paper's order; the claims come in this order
FIGURES = (
    "fig01_framework", "fig02_heatmaps", "fig03_04_controls", "fig05_relationship", "fig06_table1_social",
    "fig07_topk", "fig08_clipping", "fig09_sample_size", "table2_persona_disjoint", "table4_fig10_judge_human",
    "table5_nonlinear", "fig11_tom", "power", "dialogs",
)


def module(name: str) -> ModuleType:
    """The module of notebook ``name`` (imported when first asked for: a figure's module imports
    this package for what the figures share)."""
    if name not in FIGURES:
        raise KeyError(f"no figure module {name!r}; figures: {', '.join(FIGURES)}")
    return importlib.import_module(f"{__name__}.{name}")


def claims() -> tuple[tuple[Callable, str], ...]:
    """Every claim of the paper, in the paper's order: ``(function, data/published.json key)``."""
    return tuple(c for name in FIGURES for c in getattr(module(name), "CLAIMS", ()))


def claim(key: str, res, published: dict) -> list:
    """The claims of one ``data/published.json`` entry (e.g. ``"fig3_4"``: passive, lags, shuffled, pseudo)."""
    # lazy: synclib.figures.verdicts imports this package (a cycle at load time)
    from synclib.figures.verdicts import evaluate

    every = claims()
    fns = [(f, k) for f, k in every if k == key]
    if not fns:
        raise KeyError(f"no claim for {key!r}; keys: {sorted({k for _, k in every})}")
    return evaluate(fns, res, published)


def claims_summary(res, published: dict) -> list[str]:
    """One Markdown line per claim of the paper (:func:`claims`, each function once)."""
    # lazy: synclib.figures.verdicts imports this package (a cycle at load time)
    from synclib.figures.verdicts import evaluate

    return [c.line() for c in evaluate(claims(), res, published)]
