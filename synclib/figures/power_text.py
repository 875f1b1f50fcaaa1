"""What the controls page (figures 3-4) and the power page share about the paired tests' text.

The pages' tables and sentences live in their modules: :mod:`synclib.figures.fig03_04_controls`
(the tests per ordered run, :func:`~synclib.figures.fig03_04_controls.why_untestable`) and
:mod:`synclib.figures.power` (the paired tests' table and the generated argument).  Here:

* :data:`ASSUMED_PAPER_DIFFERENCE`: the genuine-passive difference taken as the paper's;
* :func:`interval_text`: a row's 95 % interval over episodes, as both pages' tables write it.
"""
from __future__ import annotations

import math

import numpy as np

from synclib.stats import fmt

__all__ = ["ASSUMED_PAPER_DIFFERENCE", "interval_text"]


def interval_text(row) -> str:
    """``"0.012 to 0.034"``: the 95 % interval of a paired test's row over episodes
    (:func:`synclib.analysis.power.episode_test`), or ``"—"`` where it has none."""
    return f"{fmt(row['ci_lo'], 3)} to {fmt(row['ci_hi'], 3)}" if np.isfinite(row.get("ci_lo", math.nan)) else "—"


#: The genuine-passive SyncR² difference taken as the paper's where a run is judged against
#: it.  The paper prints no number for it (figure 4a is a bar chart without values): a stated
#: assumption, said so wherever it is used.
ASSUMED_PAPER_DIFFERENCE = 0.1
