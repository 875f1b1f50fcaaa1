"""Equal samples for every condition (ours; the controls page).

With ``analysis.equal_samples`` the analysis fits every condition of a direction at the
smallest condition's training and test counts (``sync_r2``, the fits every page uses) and each
also on all its own samples (``sync_r2_unmatched``; the rule is the analysis' ``equal_rule``
attribute, :data:`synclib.analysis.blocks.EQUAL_RULE`).  :func:`matching_table` sets the two
side by side per pair and control: how much of each gap the sample counts made.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["matching_table"]


def matching_table(res) -> pd.DataFrame:
    """Equal samples (ours, ``analysis.equal_samples``): per pair and control, the gap
    genuine minus control on equal samples (``sync_r2``, the fits every other table uses)
    and on each condition's own samples (``sync_r2_unmatched``), and the training samples
    per dataset behind each (mean over directions, split seeds and runs).

    Returns
    -------
    DataFrame
        ``pair, family, model_a, model_b, orders, control, gap_equal, gap_own, removed``
        (``gap_own - gap_equal``: the part of the gap the sample counts made),
        ``n_train`` (every condition, equal), ``n_train_genuine_own``, ``n_train_control_own``.
        Empty where the analyses have no ``sync_r2_unmatched``.
    """
    cols = ["pair", "family", "model_a", "model_b", "orders", "control", "gap_equal", "gap_own", "removed",
            "n_train", "n_train_genuine_own", "n_train_control_own"]
    if not res.runs or len(res.runs_with("sync_r2_unmatched")) < len(res.runs):
        return pd.DataFrame(columns=cols)

    def train(runs, var, cond):
        return float(np.mean([res.analysis(r.name)[var].sel(condition=cond).mean() for r in runs]))

    rows = []
    for _, runs in res.units():
        g_eq, g_own = (res.unit_value(runs, v, condition="genuine")["mean"]
                       for v in ("sync_r2", "sync_r2_unmatched"))
        for c in res.conditions():
            if c == "genuine":
                continue
            eq = g_eq - res.unit_value(runs, "sync_r2", condition=c)["mean"]
            own = g_own - res.unit_value(runs, "sync_r2_unmatched", condition=c)["mean"]
            rows.append({**res.unit_info(runs), "control": c, "gap_equal": eq, "gap_own": own,
                         "removed": own - eq, "n_train": train(runs, "n_train", "genuine"),
                         "n_train_genuine_own": train(runs, "n_train_unmatched", "genuine"),
                         "n_train_control_own": train(runs, "n_train_unmatched", c)})
    return pd.DataFrame(rows, columns=cols)
