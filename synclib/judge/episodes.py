"""Finished episodes read from a file: what ``synclib evaluate EPISODES.jsonl`` judges.

One episode per line (JSON lines), in either of two formats, told apart line by line by their fields.
synclib's own (agent 1 speaks the even utterances; an empty background is shown as ``Unknown``)::

    {"episode_id": "e1",
     "scenario": "Two friends plan a weekend trip ...",
     "agents": [{"name": "Ana Lima", "background": "...", "goal": "..."},
                {"name": "Ben Ortiz", "background": "", "goal": "..."}],
     "utterances": ["agent 1's first line", "agent 2's reply", "..."]}

Sotopia's episode export (``sotopia.database.episodes_to_jsonl``, the ``cmu-lti/sotopia`` dataset)::

    {"episode_id": "...", "scenario": "...", "codename": "...",
     "agents_background": {"Ana Lima": "...", "Ben Ortiz": "..."},
     "social_goals": {"Ana Lima": "...", "Ben Ortiz": "..."},
     "social_interactions": "<the dialog as Sotopia rendered it>", ...}

The agents are the keys of ``social_goals`` in order; the dialog is shown as Sotopia rendered it; other fields
are ignored.  Both become :class:`~synclib.judge.items.JudgeItem` objects with a cube's context block
(:func:`synclib.tasks.prompts.context_lines`); ``episode`` is the line's position (0-based, blank lines not
counted), ``episode_id`` the file's id.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from synclib.judge.errors import JudgeError
from synclib.judge.items import JudgeItem
from synclib.tasks.prompts import context_lines

__all__ = ["read_episodes", "EPISODE_FORMATS"]

#: the formats :func:`read_episodes` reads, with the fields each needs
EPISODE_FORMATS = {
    "synclib": ("episode_id", "scenario", "agents", "utterances"),
    "sotopia": ("episode_id", "scenario", "agents_background", "social_goals", "social_interactions"),
}


def _text(where: str, record: dict, field: str) -> str:
    value = record.get(field)
    if not isinstance(value, str):
        raise JudgeError(f"{where}: field {field!r} must be a string, got {type(value).__name__}")
    return value


def _synclib_item(where: str, record: dict, position: int) -> JudgeItem:
    agents = record["agents"]
    if not isinstance(agents, list) or len(agents) != 2 or not all(isinstance(a, dict) for a in agents):
        raise JudgeError(f"{where}: field 'agents' must be a list of two objects "
                         "({name, background, goal})")
    names, backgrounds, goals = [], [], []
    for i, agent in enumerate(agents, 1):
        for field in ("name", "goal"):
            if not isinstance(agent.get(field), str) or not agent[field].strip():
                raise JudgeError(f"{where}: agents[{i - 1}] needs a non-empty string {field!r}")
        names.append(agent["name"].strip())
        backgrounds.append(str(agent.get("background") or "").strip())
        goals.append(agent["goal"].strip())
    utterances = record["utterances"]
    if not isinstance(utterances, list) or not all(isinstance(u, str) for u in utterances):
        raise JudgeError(f"{where}: field 'utterances' must be a list of strings")
    intro = "\n".join(context_lines(_text(where, record, "scenario").strip(), names, backgrounds, goals))
    return JudgeItem(position, -1, 0, intro, (names[0], names[1]), tuple(utterances),
                     episode_id=str(record["episode_id"]))


def _sotopia_item(where: str, record: dict, position: int) -> JudgeItem:
    goals, backgrounds = record["social_goals"], record["agents_background"]
    for field, value in (("social_goals", goals), ("agents_background", backgrounds)):
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise JudgeError(f"{where}: field {field!r} must map agent names to strings")
    names = list(goals)
    if len(names) != 2:
        raise JudgeError(f"{where}: 'social_goals' must name two agents, it names {len(names)}")
    missing = [n for n in names if n not in backgrounds]
    if missing:
        raise JudgeError(f"{where}: 'agents_background' has no entry for {missing[0]!r}")
    intro = "\n".join(context_lines(_text(where, record, "scenario").strip(), names,
                                    [backgrounds[n].strip() for n in names],
                                    [goals[n].strip() for n in names]))
    return JudgeItem(position, -1, 0, intro, (names[0], names[1]), (),
                     transcript=_text(where, record, "social_interactions").strip(),
                     episode_id=str(record["episode_id"]))


def read_episodes(path: str | os.PathLike) -> list[JudgeItem]:
    """Read and check every line of a file of finished episodes; JudgeItems in file order.

    Raises
    ------
    JudgeError
        Naming the file and line: unreadable JSON, a record of neither format, a field of the wrong type, an empty
        file, or an ``episode_id`` that repeats.
    """
    path = Path(path)
    if not path.is_file():
        raise JudgeError(f"episodes file {path} does not exist")
    items: list[JudgeItem] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise JudgeError(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise JudgeError(f"{where}: an episode must be a JSON object")
            fmt = next((f for f, fields in EPISODE_FORMATS.items() if all(k in record for k in fields)), None)
            if fmt is None:
                need = "; ".join(f"{f}: {', '.join(fields)}" for f, fields in EPISODE_FORMATS.items())
                raise JudgeError(f"{where}: neither episode format (fields needed, {need})")
            eid = str(record["episode_id"])
            if not eid.strip():
                raise JudgeError(f"{where}: empty 'episode_id'")
            if eid in seen:
                raise JudgeError(f"{where}: episode_id {eid!r} repeats line {seen[eid]}")
            seen[eid] = lineno
            make = _synclib_item if fmt == "synclib" else _sotopia_item
            items.append(make(where, record, len(items)))
    if not items:
        raise JudgeError(f"{path}: no episodes")
    return items
