"""The judge score table ``PAIR.judge.csv``: one row per (episode, sim_seed, agent, dimension), columns
:data:`TABLE_COLUMNS`; building, reading, writing and reducing it as the protocol defines.  Imports no backend."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from synclib.judge.errors import JudgeError
from synclib.judge.rubric import DIMENSIONS

__all__ = ["TABLE_COLUMNS", "make_row", "make_table", "read_table", "save_table",
           "overall_scores", "social_performance"]

#: Columns of the tidy score table, in order.
TABLE_COLUMNS = [
    "episode", "task_index", "sim_seed", "agent", "agent_name", "dimension",
    "score", "expected", "reasoning", "judge", "mode", "error", "raw",
]


def make_row(item: Any, agent: int, dim: str, judge: str, mode: str, score=None,
             expected=None, reasoning: str = "", error: str = "", raw: str = "") -> dict:
    """The row (:data:`TABLE_COLUMNS`) of a JudgeItem's ``agent`` (1 or 2) on dimension ``dim``."""
    return {
        "episode": item.episode, "task_index": item.task_index, "sim_seed": item.sim_seed,
        "agent": agent, "agent_name": item.agent_names[agent - 1], "dimension": dim,
        "score": score, "expected": expected, "reasoning": reasoning, "judge": judge,
        "mode": mode, "error": error, "raw": raw,
    }


def make_table(rows: list[dict]) -> pd.DataFrame:
    """:func:`make_row` rows as a typed table, sorted by episode, sim seed, agent and dimension order."""
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    table["score"] = pd.array(table["score"], dtype="Int64")
    table["expected"] = pd.to_numeric(table["expected"], errors="coerce").astype(float)
    for c in ("reasoning", "error", "raw", "agent_name", "judge", "mode", "dimension"):
        table[c] = table[c].fillna("").astype(str)
    order = {d: i for i, d in enumerate(DIMENSIONS)}
    table = table.assign(_d=table["dimension"].map(order)).sort_values(
        ["episode", "sim_seed", "agent", "_d"], kind="stable").drop(columns="_d")
    return table.reset_index(drop=True)


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """Read a ``.judge.csv`` written by :func:`save_table`."""
    table = pd.read_csv(path, keep_default_na=False, na_values={"score": [""], "expected": [""]})
    missing = [c for c in TABLE_COLUMNS if c not in table.columns]
    if missing:
        raise JudgeError(f"{path}: not a judge table, missing columns {missing}")
    table["score"] = pd.array(pd.to_numeric(table["score"]), dtype="Int64")
    return table


def save_table(table: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write the table as CSV atomically (temporary file, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    table.to_csv(tmp, index=False)
    os.replace(tmp, path)
    return path


def overall_scores(table: pd.DataFrame, column: str = "score") -> pd.DataFrame:
    """Each agent's overall score, the mean of its 7 dimensions' ``column`` (``"score"`` or ``"expected"``): one
    row per (episode, task_index, sim_seed, agent) with ``overall`` (NaN unless all 7 are scored) and ``n_scored``."""
    keys = ["episode", "task_index", "sim_seed", "agent"]
    t = table.assign(_v=pd.to_numeric(table[column], errors="coerce").astype(float))
    g = t.groupby(keys, sort=True)["_v"]
    out = pd.DataFrame({"n_scored": g.count(), "overall": g.mean()}).reset_index()
    out.loc[out["n_scored"] < len(DIMENSIONS), "overall"] = np.nan
    return out


def social_performance(table: pd.DataFrame, column: str = "score",
                       by_agent: bool = False) -> float | pd.Series:
    """An ordered run's social performance as the paper's code aggregates it (protocol correction 14;
    ``data_analysis.py`` ``get_performance_separate``): a dialog counts only when both agents have an overall
    score; each agent's are averaged over an episode's valid seeds, then over episodes; the run's score is the
    mean of its two agents (float), or a Series indexed by agent (1, 2) when ``by_agent``.  Both speaking orders
    are averaged by :meth:`synclib.analysis.results.Results.social_table`."""
    ov = overall_scores(table, column)
    wide = ov.pivot_table(index=["episode", "sim_seed"], columns="agent", values="overall",
                          dropna=False).reindex(columns=[1, 2])
    valid = wide[wide.notna().all(axis=1)]
    per_agent = valid.groupby(level="episode").mean().mean()
    return per_agent if by_agent else float(per_agent.mean())
