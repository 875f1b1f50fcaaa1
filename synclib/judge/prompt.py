"""The judge's messages: the JSON-mode prompt, its repair, and the constrained questions.

The JSON-mode prompt (protocol, "Social performance") is one user message after a
``"You are a helpful assistant."`` system message::

    {complete, unmasked intro}            (synclib.tasks.prompts.judge_intro)
    Turn #0: {agent 1} said: "{utterance 0}"
    Turn #1: {agent 2} said: "{utterance 1}"
    ...
    {instructions}

The lines follow Sotopia's evaluator history (``Observation``'s ``Turn #n: ``, ``AgentAction``'s
``{name} said: "{argument}"``), unlike the agents' own history lines (no ``#``, no quotes).  With
``layout="reference"`` the message is the paper's code's: ``complete_intro + "\n".join(lines) + instructions``
with the agents' own lines and no separators.  ``{instructions}``: the scenarios directory's
``judge_instructions.txt`` (the paper's: Sotopia's, with its JSON schema), else
:data:`~synclib.judge.rubric.EMBEDDED_INSTRUCTIONS`.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence

from synclib.judge.errors import JudgeError
from synclib.judge.items import JudgeItem
from synclib.judge.rubric import DIMENSIONS, EMBEDDED_INSTRUCTIONS, SCORE_RANGES, rubric_lines
from synclib.tasks.prompts import speaker_line
from synclib.tasks.scenarios import task_dir

__all__ = ["SYSTEM_MESSAGE", "render_transcript", "item_transcript", "judge_prompt", "judge_messages",
           "repair_messages", "constrained_question", "load_instructions"]

SYSTEM_MESSAGE = "You are a helpful assistant."
TURN_TEMPLATE = 'Turn #{turn}: {name} said: "{utterance}"'
INSTRUCTIONS_FILENAME = "judge_instructions.txt"
REPAIR_TEMPLATE = (
    "Your evaluation above could not be used:\n{problems}\n"
    "Reply again with only the corrected JSON object: both agent_1_evaluation and "
    "agent_2_evaluation, each with all seven dimensions ({dims}), each a reasoning string "
    "and an integer score within its range ({ranges})."
)


def render_transcript(agent_names: Sequence[str], utterances: Sequence[str],
                      layout: str = "sotopia") -> str:
    """T dialog lines joined by ``"\\n"``, agent 1 at even ``t``: ``Turn #t: {name} said: "{utterance}"``
    (``sotopia``) or the agents' own ``Turn t: {name} said:{utterance}`` (``reference``)."""
    if layout == "reference":
        return "\n".join(speaker_line(agent_names, t, u) for t, u in enumerate(utterances))
    return "\n".join(
        TURN_TEMPLATE.format(turn=t, name=agent_names[t % 2], utterance=u)
        for t, u in enumerate(utterances)
    )


def item_transcript(item: JudgeItem) -> str:
    """``item.transcript`` when it carries one, else :func:`render_transcript` of its utterances."""
    if item.transcript is not None:
        return item.transcript
    return render_transcript(item.agent_names, item.utterances, item.layout)


def judge_prompt(item: JudgeItem, instructions: str) -> str:
    """The JSON-mode user message: intro, dialog, instructions, laid out as ``item.layout`` says."""
    lines = item_transcript(item)
    if item.layout == "reference":
        return item.intro + lines + instructions
    return "\n".join([item.intro.rstrip("\n"), lines, instructions.strip("\n")])


def judge_messages(item: JudgeItem, instructions: str) -> list[dict]:
    """System + user chat messages of the JSON-mode judge."""
    return [
        {"role": "system", "content": SYSTEM_MESSAGE},
        {"role": "user", "content": judge_prompt(item, instructions)},
    ]


def repair_messages(messages: list[dict], raw: str, errors: Mapping) -> list[dict]:
    """``messages`` (which produced the answer ``raw``), the answer, and a user message asking for a repair and
    listing at most 20 problems of ``errors`` (:func:`~synclib.judge.parse.parse_evaluation`'s)."""
    problems = sorted(set(errors.values()))
    shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
    text = REPAIR_TEMPLATE.format(
        problems="\n".join(f"- {p}" for p in shown),
        dims=", ".join(DIMENSIONS),
        ranges=", ".join(f"{d} {lo}..{hi}" for d, (lo, hi) in SCORE_RANGES.items()),
    )
    return list(messages) + [
        {"role": "assistant", "content": raw or ""},
        {"role": "user", "content": text},
    ]


def constrained_question(item: JudgeItem, agent: int, dimension: str) -> str:
    """User message asking for agent ``agent`` (1 or 2)'s score on ``dimension``.  The 14 questions of an item
    share everything but the last sentence, a prefix prefilled once
    (:func:`~synclib.judge.backends.score_candidates`)."""
    lo, hi = SCORE_RANGES[dimension]
    return (
        f"{item.intro.rstrip()}\n{item_transcript(item)}\n\n"
        "Evaluate the participants of this conversation on Sotopia-eval's social "
        f"dimensions:\n{rubric_lines()}\n"
        f"Rate {item.agent_names[agent - 1]} on {dimension} with an integer from {lo} to "
        f"{hi}. Answer with the integer only."
    )


def load_instructions(scenarios: str | os.PathLike | None) -> tuple[str, str]:
    """``(text, source)``: the instructions to append, and the file they came from or ``"embedded"``.
    ``scenarios`` is a scenarios directory (its ``judge_instructions.txt`` used when present), a dataset name
    (``"sotopia"``'s holds the paper's), the instructions file itself, or ``"embedded"``/None."""
    if scenarios is not None and str(scenarios) != "embedded":
        p = task_dir(scenarios)  # a folder, or a dataset name ("sotopia": its cache folder)
        f = p / INSTRUCTIONS_FILENAME if p.is_dir() else p
        if f.is_file():
            text = f.read_text(encoding="utf-8")
            if not text.strip():
                raise JudgeError(f"{f}: judge instructions file is empty")
            return text, str(f)
        if not p.exists():
            raise JudgeError(f"--scenarios {scenarios}: no such file or directory")
    return EMBEDDED_INSTRUCTIONS, "embedded"
