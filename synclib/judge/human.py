"""Human ratings of Sotopia-eval, and a judge held against them (the paper's appendix H: table 4, figure 10).

The ratings file
----------------
A CSV with one row per episode, agent, dimension and rater::

    episode_id,agent,dimension,score,rater
    e1,1,believability,8,r1

``episode_id``  the episode's id in the episodes file the judge scored (``synclib evaluate EPISODES.jsonl``)
``agent``       1 or 2 (agent 1 speaks first)
``dimension``   one of :data:`~synclib.judge.rubric.DIMENSIONS`
``score``       a number within the dimension's range (:data:`~synclib.judge.rubric.SCORE_RANGES`)
``rater``       optional label; rows repeating an episode, agent and dimension are raters, averaged
``dialog``      optional: ``no`` where the episode has no dialog a judge could read (three of Sotopia-π's);
                such ratings are accepted though the judge's table lacks them, and can only be held against
                published scores

Every rated episode and agent carries all seven dimensions.

Agreement
---------
:func:`agreement` gives table 4 and :func:`differences` figure 10.  The paper's "within one standard deviation
of human ratings" does not say which deviation; we take, per dimension, the standard deviation of the
rater-mean scores over all rated agents and episodes, so differences compare across ranges.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from synclib.judge.errors import JudgeError
from synclib.judge.rubric import DIMENSIONS, SCORE_RANGES
from synclib.paths import BENCH_RESULTS
from synclib.stats import pearson

__all__ = ["RATING_COLUMNS", "MEASURED_FILE", "read_ratings", "mean_ratings", "paired_scores", "agreement",
           "differences", "within_share", "episode_coverage", "load_measured", "measured_differences"]

#: the judges measured on Sotopia-π's published ratings (``bench/bench_judge_human.py``)
MEASURED_FILE = "judge_human_sotopia_pi.json"
#: the columns a ratings file must have (``rater`` is optional)
RATING_COLUMNS = ("episode_id", "agent", "dimension", "score")


def read_ratings(path: str | os.PathLike, episode_ids=None) -> pd.DataFrame:
    """Read and check a human-ratings CSV.

    Parameters
    ----------
    path : path of the CSV
    episode_ids : collection of str, optional
        The episodes the judge scored; ratings of others are refused unless marked ``dialog = no``.

    Returns
    -------
    pandas.DataFrame
        ``episode_id`` (str), ``agent`` (int), ``dimension``, ``score`` (float), ``rater`` (str, may be empty),
        ``dialog`` (bool) and ``line`` (the row's line, the header being line 1).

    Raises
    ------
    JudgeError
        Naming the file and line of the first problem: a missing column, bad agent, dimension, score or
        ``dialog``, an unknown episode id, or an episode and agent missing a dimension.
    """
    path = Path(path)
    if not path.is_file():
        raise JudgeError(f"ratings file {path} does not exist")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in RATING_COLUMNS if c not in table.columns]
    if missing:
        raise JudgeError(f"{path}: missing column {missing[0]!r} (a ratings file has columns "
                         f"{', '.join(RATING_COLUMNS)} and optionally rater)")
    if table.empty:
        raise JudgeError(f"{path}: no ratings")
    known = None if episode_ids is None else {str(e) for e in episode_ids}
    rows = []
    for i, rec in enumerate(table.to_dict("records")):
        where = f"{path}, line {i + 2}"
        eid = rec["episode_id"].strip()
        if not eid:
            raise JudgeError(f"{where}: empty episode_id")
        dialog = str(rec.get("dialog", "")).strip().lower()
        if dialog not in ("", "yes", "no"):
            raise JudgeError(f"{where}: dialog must be yes, no or empty, got {rec['dialog']!r}")
        if known is not None and eid not in known and dialog != "no":
            raise JudgeError(f"{where}: episode_id {eid!r} is not among the judged episodes")
        if rec["agent"].strip() not in ("1", "2"):
            raise JudgeError(f"{where}: agent must be 1 or 2, got {rec['agent']!r}")
        dim = rec["dimension"].strip()
        if dim not in SCORE_RANGES:
            raise JudgeError(f"{where}: unknown dimension {dim!r} (one of {', '.join(DIMENSIONS)})")
        try:
            score = float(rec["score"])
        except ValueError:
            raise JudgeError(f"{where}: score {rec['score']!r} is not a number") from None
        lo, hi = SCORE_RANGES[dim]
        if not lo <= score <= hi:
            raise JudgeError(f"{where}: score {rec['score']} of {dim} is outside its range {lo} to {hi}")
        rows.append({"episode_id": eid, "agent": int(rec["agent"]), "dimension": dim, "score": score,
                     "rater": str(rec.get("rater", "")).strip(), "dialog": dialog != "no", "line": i + 2})
    ratings = pd.DataFrame(rows)
    for (eid, agent), group in ratings.groupby(["episode_id", "agent"], sort=False):
        absent = [d for d in DIMENSIONS if d not in set(group["dimension"])]
        if absent:
            raise JudgeError(f"{path}, line {group['line'].iloc[0]}: episode {eid!r}, agent {agent} "
                             f"has no {absent[0]} rating (every rated agent needs all seven dimensions)")
    return ratings


def mean_ratings(ratings: pd.DataFrame) -> pd.DataFrame:
    """The raters' mean per episode, agent and dimension: columns ``episode_id``, ``agent``, ``dimension``,
    ``human`` (mean), ``rater_sd`` (ddof 1; NaN with one rater), ``n_raters``."""
    g = ratings.groupby(["episode_id", "agent", "dimension"], sort=False)["score"]
    return g.agg(human="mean", rater_sd="std", n_raters="size").reset_index()


def paired_scores(judge_table: pd.DataFrame, ratings: pd.DataFrame) -> pd.DataFrame:
    """:func:`mean_ratings` plus ``judge`` (float), for every rated agent and dimension the judge scored;
    ``judge_table`` is the table of ``synclib evaluate EPISODES.jsonl`` (with ``episode_id``)."""
    if "episode_id" not in judge_table.columns:
        raise JudgeError("the judge table has no episode_id column: judge the episodes file the "
                         "ratings refer to (synclib evaluate EPISODES.jsonl)")
    judged = judge_table.assign(episode_id=judge_table["episode_id"].astype(str),
                                judge=pd.to_numeric(judge_table["score"], errors="coerce").astype(float))
    judged = judged[["episode_id", "agent", "dimension", "judge"]].dropna(subset=["judge"])
    return mean_ratings(ratings).merge(judged, on=["episode_id", "agent", "dimension"], how="inner")


def agreement(paired: pd.DataFrame) -> pd.DataFrame:
    """Table 4: per dimension (Sotopia's order), Pearson r between judge and raters' mean: ``dimension``, ``r``,
    ``p`` (two-sided), ``n``, ``reason`` (why r is missing, else empty)."""
    rows = []
    for dim in DIMENSIONS:
        sub = paired[paired["dimension"] == dim]
        c = pearson(sub["judge"], sub["human"])
        rows.append({"dimension": dim, "r": c.r, "p": c.p, "n": c.n, "reason": c.reason or ""})
    return pd.DataFrame(rows)


def differences(paired: pd.DataFrame) -> pd.DataFrame:
    """Figure 10: ``paired`` plus ``difference`` (judge minus raters' mean), ``human_sd`` (the dimension's
    standard deviation of human scores, ddof 1) and ``within`` (``|difference| <= human_sd``; False if undefined)."""
    sd = paired.groupby("dimension")["human"].std()
    out = paired.assign(difference=paired["judge"] - paired["human"],
                        human_sd=paired["dimension"].map(sd))
    out["within"] = out["difference"].abs() <= out["human_sd"]  # NaN spread compares False
    return out


def within_share(diffs: pd.DataFrame) -> float:
    """The share of ``within`` over rows with a defined spread (the paper: 75.8 % for gpt-oss-120b)."""
    ok = np.isfinite(diffs["human_sd"].to_numpy(dtype=float))
    return float(diffs.loc[ok, "within"].mean()) if ok.any() else float("nan")


#: why a rated episode without a dialog has no score from a judge that was not given it
NO_DIALOG = "no dialog to read (the ratings file marks it dialog = no)"


def episode_coverage(judge_table: pd.DataFrame, ratings: pd.DataFrame,
                     not_judged: str = "not in the judge's table") -> dict:
    """Which rated episodes a judge's agreement rests on (those with at least one scored pair), and why each
    other one is left out: the first of its table rows' ``error``, :data:`NO_DIALOG`, ``not_judged``.

    Returns
    -------
    dict
        ``episodes`` (used), ``rated_episodes``, ``without_dialog`` (used episodes without a dialog) and
        ``left_out``: one ``{"reason", "n", "episode_ids"}`` per reason, ids in the ratings' order.
    """
    if "episode_id" not in judge_table.columns:
        raise JudgeError("the judge table has no episode_id column: judge the episodes file the "
                         "ratings refer to (synclib evaluate EPISODES.jsonl)")
    table = judge_table.assign(episode_id=judge_table["episode_id"].astype(str))
    rated = list(dict.fromkeys(ratings["episode_id"]))
    dialog = ratings.groupby("episode_id")["dialog"].all() if "dialog" in ratings.columns else None
    pairs = (mean_ratings(ratings)[["episode_id", "agent", "dimension"]]
             .merge(table.loc[table["score"].notna(), ["episode_id", "agent", "dimension"]]))
    used = set(pairs["episode_id"])
    errors = table.groupby("episode_id")["error"].agg(
        lambda e: next((str(x) for x in e if str(x).strip()), "")) if "error" in table.columns else {}
    in_table = set(table["episode_id"])
    reasons: dict[str, list[str]] = {}
    for eid in rated:
        if eid in used:
            continue
        if eid in in_table:
            why = errors.get(eid, "") or "the judge gave it no score"
        elif dialog is not None and not dialog[eid]:
            why = NO_DIALOG
        else:
            why = not_judged
        reasons.setdefault(why, []).append(eid)
    return {"episodes": len(used), "rated_episodes": len(rated),
            "without_dialog": [e for e in rated if e in used and dialog is not None and not dialog[e]],
            "left_out": [{"reason": why, "n": len(ids), "episode_ids": ids} for why, ids in reasons.items()]}


def load_measured(bench_dir=None) -> dict | None:
    """The record of :data:`MEASURED_FILE` in ``bench_dir`` (default ``bench/results``), or None."""
    import json

    path = Path(bench_dir or BENCH_RESULTS) / MEASURED_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def measured_differences(measured: dict, index: int = 0) -> pd.DataFrame:
    """Figure 10's frame (``dimension``, ``difference``, ``within``) of the record's ``index``-th judge."""
    rows = measured["judges"][index]["differences"]
    return pd.DataFrame(rows, columns=["dimension", "difference", "within"])
