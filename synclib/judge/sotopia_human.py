"""The published human Sotopia-eval ratings (Sotopia-π's study) in synclib's formats.

``synclib fetch sotopia-human`` (:data:`synclib.tasks.datasets.SOTOPIA_HUMAN`) checks the study's files against
their hashes and calls :func:`prepare`, which writes beside them:

``episodes.jsonl``
    Every rated episode with a dialog, in Sotopia's export format (:mod:`synclib.judge.episodes`; backgrounds
    rendered from ``personal_info``, the dialog as Sotopia's judge reads it), plus ``condition`` (the study's
    ``model`` column) and ``source`` (the file).
``ratings.csv``
    :mod:`synclib.judge.human`'s format for every rated episode; ``rater`` is a hash of the Prolific id.
``gpt-4.judge.csv``
    A judge table (with ``episode_id``) of the GPT-4 scores Sotopia's authors published
    (``complete_gpt_score.json``), rows for every rated episode; only GPT-4 episodes have scores, the others
    say so in ``error``.

The study's files: one CSV per kind of agent, one row per episode and annotator, columns ``pk`` (episode id),
``model``, ``data`` (JSON: ``scenario``, ``names`` (agent 1 first), ``personal_info``, ``social_goal``,
``parsed_conversation``), ``prolific_id`` and ``<dimension>_<agent>`` scores.  Three rated episodes have no
dialog in ``data``: they are left out of ``episodes.jsonl`` (a judge must read it) but kept in ``ratings.csv``
(``dialog = no``) and ``gpt-4.judge.csv`` (published scores need none).

These are Sotopia-π's ratings (Wang et al., 2024; Prolific, SOTOPIA-hard tasks), not the Sotopia paper's
Mechanical Turk annotations (Zhou et al., 2023) that the paper's appendix H used, which were never published
as files.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path

import pandas as pd

from synclib.judge.errors import JudgeError
from synclib.judge.rubric import DIMENSIONS, SCORE_RANGES
from synclib.judge.table import make_table

__all__ = ["RATING_FILES", "SCORES_FILE", "OUTPUTS", "GPT4_JUDGE", "prepare", "usage"]

#: the study's rating files, one per kind of agent (in :data:`synclib.tasks.datasets.SOTOPIA_HUMAN`)
RATING_FILES = ("gpt4_final.csv", "gpt3.5_final.csv", "mistral-instruct_final.csv", "BC_final.csv",
                "SR_final.csv", "BC+SR_final.csv")
#: GPT-4's scores of the GPT-4 episodes
SCORES_FILE = "complete_gpt_score.json"
#: what :func:`prepare` writes: episodes, ratings, the GPT-4 judge table
OUTPUTS = ("episodes.jsonl", "ratings.csv", "gpt-4.judge.csv")
#: the judge name of ``gpt-4.judge.csv``
GPT4_JUDGE = "gpt-4 (Sotopia's scores)"
_VERSION = "3"  # bump when the outputs' format changes: prepare() then rewrites them


def _rater(prolific_id: str) -> str:
    return "r" + hashlib.sha256(prolific_id.strip().encode()).hexdigest()[:10]


def _background(name: str, info: dict) -> str:
    """One paragraph from the study's ``personal_info`` of an agent (our own wording)."""
    parts = [f"{name} is {info.get('age', '?')} years old, {str(info.get('profession', '')).strip()}."
             if info.get("age") else f"{name}: {str(info.get('profession', '')).strip()}."]
    if info.get("pronouns"):
        parts.append(f"Pronouns: {info['pronouns']}.")
    for key, label in (("interests", None), ("personality", "Personality and values"), ("secrets", "Secret")):
        text = str(info.get(key) or "").strip().rstrip(".")
        if text:
            parts.append(f"{label}: {text}." if label else f"{text}.")
    return " ".join(parts)


def _transcript(turns: list, names: list[str]) -> str:
    """The study's ``parsed_conversation`` as Sotopia's judge reads a dialog."""
    lines = []
    for i, turn in enumerate(turns):
        speaker, text = str(turn.get("speaker", "")).strip(), str(turn.get("dialogue", "")).strip()
        if any(text.startswith(n) for n in names):  # "NAME left the conversation", "NAME [action] ..."
            lines.append(f"Turn #{i}: {text}")
        else:
            lines.append(f"Turn #{i}: {speaker} said: {text}")
    return "\n\n".join(lines)


def _read_study(root: Path) -> tuple[dict, list[dict], dict]:
    """Episodes with a dialog (pk -> export record), rating rows (with ``dialog``), and rated pk -> agent names
    (empty without a dialog), in the files' order."""
    episodes: dict[str, dict] = {}
    ratings: list[dict] = []
    rated: dict[str, list[str]] = {}
    for fname in RATING_FILES:
        with open(root / fname, newline="", encoding="utf-8") as fh:
            for lineno, row in enumerate(csv.DictReader(fh), 2):
                where = f"{root / fname}, record at line {lineno}"
                pk = (row.get("pk") or "").strip()
                if not pk:
                    raise JudgeError(f"{where}: no pk")
                data = json.loads(row["data"])
                rated.setdefault(pk, [])
                if "parsed_conversation" in data and pk not in episodes:
                    names = [str(n).strip() for n in data["names"]]
                    info = data.get("personal_info", {})
                    rated[pk] = names
                    episodes[pk] = {
                        "episode_id": pk, "scenario": str(data["scenario"]).strip(), "codename": "",
                        "agents_background": {n: _background(n, info.get(n, {})) for n in names},
                        "social_goals": {n: str(data["social_goal"][n]).strip() for n in names},
                        "social_interactions": _transcript(data["parsed_conversation"], names),
                        "condition": row["model"], "source": fname}
                for agent in (1, 2):
                    for dim in DIMENSIONS:
                        score = float(row[f"{dim}_{agent}"])
                        lo, hi = SCORE_RANGES[dim]
                        if not lo <= score <= hi:
                            raise JudgeError(f"{where}: {dim}_{agent} = {score} outside {lo} to {hi}")
                        ratings.append({"episode_id": pk, "agent": agent, "dimension": dim, "score": score,
                                        "rater": _rater(row["prolific_id"]), "condition": row["model"]})
    for rec in ratings:  # an episode has a dialog when any of its records holds one
        rec["dialog"] = "yes" if rec["episode_id"] in episodes else "no"
    return episodes, ratings, rated


def _gpt4_table(root: Path, rated: dict) -> pd.DataFrame:
    """GPT-4's published scores as a judge table with ``episode_id``, rows for every rated episode."""
    scores = json.loads((root / SCORES_FILE).read_text(encoding="utf-8"))
    order = {pk: i for i, pk in enumerate(rated)}
    rows = []
    for pk, i in order.items():
        entry = scores.get(pk)
        names = rated[pk] or ["", ""]
        for agent in (1, 2):
            for dim in DIMENSIONS:
                score = None if entry is None else int(round(float(entry[f"agent{agent}"][dim])))
                rows.append({"episode": i, "task_index": -1, "sim_seed": 0, "agent": agent,
                             "agent_name": names[agent - 1], "dimension": dim, "score": score, "expected": None,
                             "reasoning": "", "judge": GPT4_JUDGE, "mode": "published",
                             "error": "" if entry else "no published GPT-4 score (only the GPT-4 episodes have one)",
                             "raw": ""})
    table = make_table(rows)
    table.insert(1, "episode_id", table["episode"].map({i: pk for pk, i in order.items()}))
    return table


def prepare(root: str | os.PathLike, log=None) -> dict[str, Path]:
    """Write :data:`OUTPUTS` into ``root`` unless there for this format version; ``{"episodes", "ratings",
    "gpt4"}`` -> their paths."""
    root = Path(root)
    out = {k: root / f for k, f in zip(("episodes", "ratings", "gpt4"), OUTPUTS)}
    stamp = root / ".prepared"
    if stamp.is_file() and stamp.read_text() == _VERSION and all(p.is_file() for p in out.values()):
        return out
    episodes, ratings, rated = _read_study(root)
    tmp = out["episodes"].with_name(".episodes.jsonl.part")
    tmp.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in episodes.values()), encoding="utf-8")
    os.replace(tmp, out["episodes"])
    frame = pd.DataFrame(ratings, columns=["episode_id", "agent", "dimension", "score", "rater", "condition", "dialog"])
    frame.to_csv(out["ratings"].with_name(".ratings.csv.part"), index=False)
    os.replace(out["ratings"].with_name(".ratings.csv.part"), out["ratings"])
    _gpt4_table(root, rated).to_csv(out["gpt4"].with_name(".gpt4.part"), index=False)
    os.replace(out["gpt4"].with_name(".gpt4.part"), out["gpt4"])
    stamp.write_text(_VERSION)
    no_dialog = [pk for pk in rated if pk not in episodes]
    if no_dialog:
        (log or (lambda m: None))(
            f"[synclib] sotopia-human: {len(no_dialog)} rated episodes have no dialog in the study's files "
            f"({', '.join(no_dialog)}): kept in ratings.csv (dialog = no) and gpt-4.judge.csv, since "
            "comparing published scores with the ratings needs no dialog; left out of episodes.jsonl, "
            "since a judge must read it")
    return out


def usage(root: str | os.PathLike) -> str:
    """What to do with the prepared files (printed by ``synclib fetch sotopia-human``)."""
    out = {k: Path(root) / f for k, f in zip(("episodes", "ratings", "gpt4"), OUTPUTS)}
    return (f"  episodes: {out['episodes']}\n  ratings:  {out['ratings']}\n  GPT-4's published scores: {out['gpt4']}\n"
            "Judge the episodes with your judge, then give the page both tables:\n"
            f"  synclib evaluate {out['episodes']} --scenarios sotopia --judge-url URL --judge-model MODEL\n"
            f"  make book ARGS=\"--set notebooks.human_ratings={out['ratings']} "
            f"--set notebooks.human_judge_scores={out['episodes'].with_suffix('.judge.csv')}\"\n"
            f"(or --set notebooks.human_judge_scores={out['gpt4']} for GPT-4's published scores, no judge needed)")
