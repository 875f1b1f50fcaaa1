"""Table 2: SyncR² with a persona-disjoint split (appendix E).

The notebook ``notebooks/table2_persona_disjoint.md`` draws this page from the functions here:
:func:`table` (ours, per pair), then what table 5 shares with it: the paper's rows beside ours
(:func:`~synclib.figures.report.comparison_with_paper`, :func:`~synclib.figures.report.wide_table`), the bars
(:func:`~synclib.figures.charts.comparison_bars`) and the sentence
(:func:`~synclib.figures.report.sentence_comparison`).
"""
from __future__ import annotations

import pandas as pd

from synclib.figures.charts import comparison_bars
from synclib.figures.report import comparison_with_paper, sentence_comparison, wide_table
from synclib.figures.verdicts import Claim, setting_claim

__all__ = ["VAR", "table", "comparison_with_paper", "wide_table", "comparison_bars", "sentence_comparison",
           "persona", "CLAIMS"]

#: the analysis variable of the persona-disjoint split
VAR = "persona_disjoint_sync_r2"


def table(res, settings: tuple[str, str], var: str = VAR) -> pd.DataFrame:
    """Table 2: genuine SyncR² (clipped) against ``var`` per pair, both with the
    reference's aggregation.

    ``settings`` names the two columns, e.g. ``("original", "persona-disjoint")``;
    ``var`` is e.g. ``persona_disjoint_sync_r2``.  Pairs without ``var`` are left out.
    """
    rows = []
    for _, runs in res.units_with(var):
        for setting, v in ((settings[0], "sync_r2"), (settings[1], var)):
            val = res.unit_value(runs, v, condition="genuine")
            rows.append({**res.unit_info(runs), "setting": setting, "mean": val["mean"], "se": val["se"]})
    return res.mark_present(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders",
                                                    "setting", "mean", "se"]), var)


def persona(res, published: dict) -> Claim:
    """Table 2: SyncR² is largely unchanged with a persona-disjoint split."""
    return setting_claim(res, "table2", "persona", "SyncR² unchanged with a persona-disjoint split (appendix E, "
                          "table 2)", "this run has no persona-disjoint analysis.")


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((persona, "table2"),)
