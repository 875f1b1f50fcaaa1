"""Human ratings of Sotopia-eval, and a judge held against them (the paper's appendix H:
table 4 and figure 10).

The ratings file
----------------
A CSV with one row per episode, agent, dimension and rater::

    episode_id,agent,dimension,score,rater
    e1,1,believability,8,r1
    e1,1,believability,7,r2
    ...

``episode_id``
    The episode's id in the episodes file the judge scored (``synclib evaluate
    EPISODES.jsonl`` writes it into its table).
``agent``
    1 or 2 (agent 1 speaks first).
``dimension``
    One of :data:`~synclib.judge.rubric.DIMENSIONS`.
``score``
    A number within the dimension's range (:data:`~synclib.judge.rubric.SCORE_RANGES`).
``rater`` (optional)
    Any label.  Rows repeating an episode, agent and dimension are several raters; they
    are averaged, as the Sotopia authors and the paper averaged their raters per episode.
``dialog`` (optional)
    ``no`` where the rated episode has no dialog a judge could read (three of Sotopia-π's
    rated episodes, :mod:`synclib.judge.sotopia_human`); ``yes`` or empty otherwise.  Such
    an episode can be held against published scores, which need no dialog, but not against
    a judge run on the episodes: :func:`read_ratings` accepts its ratings even where the
    judge's table lacks it, and :func:`episode_coverage` says why it is left out.

Every rated episode and agent carries all seven dimensions.  :func:`read_ratings` checks
all of it before anything is computed and names the line of the first problem.

Agreement
---------
:func:`agreement`: per dimension, Pearson r between the judge's score and the raters'
mean over every rated agent of every episode, with its two-sided p-value and n (table 4).
:func:`differences`: judge minus raters' mean for every agent and dimension, and whether it
lies within one standard deviation of the human ratings (figure 10).  The paper reports
"75.8 % of the scores ... fall within one standard deviation of human ratings" without
saying which standard deviation; we take, per dimension, the standard deviation of the
human (rater-mean) scores over all rated agents and episodes, the spread that makes a
difference comparable across dimensions of different ranges.
:func:`episode_coverage`: which rated episodes a judge's numbers rest on, and why each other
rated episode is left out (a judge table without its score, no dialog to read, not judged).
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
    """Read and check a human-ratings CSV (format in the module docstring).

    Parameters
    ----------
    path : path of the CSV
    episode_ids : collection of str, optional
        The episodes the judge scored; a rating of any other episode is refused, unless
        the file marks the episode ``dialog = no`` (no judge could have read it).

    Returns
    -------
    pandas.DataFrame
        Columns ``episode_id`` (str), ``agent`` (int), ``dimension``, ``score`` (float),
        ``rater`` (str, empty when the file has none), ``dialog`` (bool: False where the
        file says ``no``) and ``line`` (the row's line in the file, the header being line 1).

    Raises
    ------
    JudgeError
        Naming the file and line: a missing column, an agent other than 1 or 2, an
        unknown dimension, a score that is not a number or lies outside its range, a
        ``dialog`` other than yes, no or empty, an unknown episode id (one with a dialog
        that the judge did not score), or an episode and agent missing a dimension.
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
    """The raters' mean per episode, agent and dimension.

    Returns
    -------
    pandas.DataFrame
        Columns ``episode_id``, ``agent``, ``dimension``, ``human`` (mean), ``rater_sd``
        (standard deviation over raters, ddof 1; NaN with one rater), ``n_raters``.
    """
    g = ratings.groupby(["episode_id", "agent", "dimension"], sort=False)["score"]
    return g.agg(human="mean", rater_sd="std", n_raters="size").reset_index()


def paired_scores(judge_table: pd.DataFrame, ratings: pd.DataFrame) -> pd.DataFrame:
    """The judge's score beside the raters' mean, for every rated agent and dimension that
    the judge scored.

    Parameters
    ----------
    judge_table : the table of ``synclib evaluate EPISODES.jsonl`` (needs ``episode_id``)
    ratings : from :func:`read_ratings`

    Returns
    -------
    pandas.DataFrame
        :func:`mean_ratings`'s columns plus ``judge`` (float).  Agents and dimensions the
        judge left without a score are dropped.
    """
    if "episode_id" not in judge_table.columns:
        raise JudgeError("the judge table has no episode_id column: judge the episodes file the "
                         "ratings refer to (synclib evaluate EPISODES.jsonl)")
    judged = judge_table.assign(episode_id=judge_table["episode_id"].astype(str),
                                judge=pd.to_numeric(judge_table["score"], errors="coerce").astype(float))
    judged = judged[["episode_id", "agent", "dimension", "judge"]].dropna(subset=["judge"])
    return mean_ratings(ratings).merge(judged, on=["episode_id", "agent", "dimension"], how="inner")


def agreement(paired: pd.DataFrame) -> pd.DataFrame:
    """Table 4: per dimension, Pearson r between judge and raters' mean, its p and n.

    Returns
    -------
    pandas.DataFrame
        One row per dimension in Sotopia's order: ``dimension``, ``r``, ``p``, ``n``,
        ``reason`` (why r is missing, else empty).
    """
    rows = []
    for dim in DIMENSIONS:
        sub = paired[paired["dimension"] == dim]
        c = pearson(sub["judge"], sub["human"])
        rows.append({"dimension": dim, "r": c.r, "p": c.p, "n": c.n, "reason": c.reason or ""})
    return pd.DataFrame(rows)


def differences(paired: pd.DataFrame) -> pd.DataFrame:
    """Figure 10: judge minus raters' mean for every agent and dimension.

    Returns
    -------
    pandas.DataFrame
        ``paired`` plus ``difference``, ``human_sd`` (the dimension's standard deviation
        of the human scores over all rated agents and episodes, ddof 1) and ``within``
        (``|difference| <= human_sd``; False where the spread is undefined).
    """
    sd = paired.groupby("dimension")["human"].std()
    out = paired.assign(difference=paired["judge"] - paired["human"],
                        human_sd=paired["dimension"].map(sd))
    out["within"] = out["difference"].abs() <= out["human_sd"]  # NaN spread compares False
    return out


def within_share(diffs: pd.DataFrame) -> float:
    """The share of judge scores within one standard deviation of the human ratings, over
    every agent and dimension with a defined spread (the paper: 75.8 % for gpt-oss-120b)."""
    ok = np.isfinite(diffs["human_sd"].to_numpy(dtype=float))
    return float(diffs.loc[ok, "within"].mean()) if ok.any() else float("nan")


#: why a rated episode without a dialog has no score from a judge that was not given it
NO_DIALOG = "no dialog to read (the ratings file marks it dialog = no)"


def episode_coverage(judge_table: pd.DataFrame, ratings: pd.DataFrame,
                     not_judged: str = "not in the judge's table") -> dict:
    """Which rated episodes a judge's agreement rests on, and why each other one is left out.

    An episode is used when the judge scored at least one of its rated agents and
    dimensions (:func:`paired_scores` pairs exactly those).  Each left-out episode gets the
    first reason that applies: its rows in the judge's table have no score (the table's
    ``error``, e.g. "no published GPT-4 score"); it is not in the table and has no dialog
    (:data:`NO_DIALOG`); it is not in the table (``not_judged``, which the caller can make
    say why the judge was not run on it).

    Parameters
    ----------
    judge_table : a judge table with ``episode_id``
    ratings : from :func:`read_ratings`

    Returns
    -------
    dict
        ``episodes`` (how many are used), ``rated_episodes`` (how many the ratings hold),
        ``without_dialog`` (the used episodes that have no dialog: published scores need
        none) and ``left_out``: one ``{"reason", "n", "episode_ids"}`` per reason, ids in the
        ratings' order.
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
    """``bench/results/judge_human_sotopia_pi.json`` (judges measured on the published human
    ratings by ``bench/bench_judge_human.py``), or None where it was not measured."""
    import json

    path = Path(bench_dir or BENCH_RESULTS) / MEASURED_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def measured_differences(measured: dict, index: int = 0) -> pd.DataFrame:
    """Figure 10's frame (``dimension``, ``difference``, ``within``) of the ``index``-th judge
    of :func:`load_measured`'s record."""
    rows = measured["judges"][index]["differences"]
    return pd.DataFrame(rows, columns=["dimension", "difference", "within"])
