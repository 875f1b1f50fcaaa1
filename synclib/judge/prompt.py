"""The judge's messages: the JSON-mode prompt, its repair, and the constrained questions.

The JSON-mode prompt (protocol, "Social performance") is one user message after a
``"You are a helpful assistant."`` system message::

    {complete, unmasked intro}            (synclib.tasks.prompts.judge_intro)
    Turn #0: {agent 1} said: "{utterance 0}"
    Turn #1: {agent 2} said: "{utterance 1}"
    ...
    {instructions}

With ``layout="reference"`` (:data:`~synclib.judge.items.LAYOUTS`) the message is the
paper's code's instead: ``complete_intro + "\n".join(lines) + instructions`` with the
agents' own ``Turn t: {name} said:{utterance}`` lines and no separators.

The transcript lines follow Sotopia's own evaluator history (``Turn #n: `` from its
``Observation`` followed by ``{name} said: "{argument}"`` from its ``AgentAction``);
they differ from the agents' own history lines (``synclib.tasks.prompts.render_history``:
no ``#``, no quotes).  ``{instructions}`` is ``judge_instructions.txt`` read from the
scenarios directory when it holds one (the paper's text: Sotopia's format
instructions with its JSON schema); otherwise, e.g. for the embedded task set,
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
    """The dialog lines, agent 1 at even ``t``: ``Turn #t: {name} said: "{utterance}"``
    (``sotopia``) or the agents' own ``Turn t: {name} said:{utterance}`` (``reference``,
    :func:`synclib.tasks.prompts.speaker_line`).

    Parameters
    ----------
    agent_names : sequence of 2 str
    utterances : sequence of T str
    layout : {"sotopia", "reference"}

    Returns
    -------
    str
        T lines joined by ``"\\n"``.
    """
    if layout == "reference":
        return "\n".join(speaker_line(agent_names, t, u) for t, u in enumerate(utterances))
    return "\n".join(
        TURN_TEMPLATE.format(turn=t, name=agent_names[t % 2], utterance=u)
        for t, u in enumerate(utterances)
    )


def item_transcript(item: JudgeItem) -> str:
    """The dialog lines the judge reads: ``item.transcript`` when the item carries one
    (an episode rendered elsewhere), else :func:`render_transcript` of its utterances."""
    if item.transcript is not None:
        return item.transcript
    return render_transcript(item.agent_names, item.utterances, item.layout)


def judge_prompt(item: JudgeItem, instructions: str) -> str:
    """The user message of the JSON-mode judge: intro, dialog, instructions, laid out as
    ``item.layout`` says."""
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
    """The conversation asking the judge, once, to repair its answer ``raw``.

    Parameters
    ----------
    messages : list of dict
        The conversation that produced ``raw``.
    raw : str
        The judge's answer.
    errors : mapping
        ``(agent, dimension) -> reason`` from :func:`synclib.judge.parse.parse_evaluation`.

    Returns
    -------
    list of dict
        ``messages`` + the answer + a user message listing the problems (20 at most).
    """
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
    """User message asking for one agent's score on one dimension.

    All 14 questions of an item share everything up to the last sentence (intro,
    dialog, the rubric of all seven dimensions), so that the shared prefix is
    prefilled once per item (see :func:`synclib.judge.backends.score_candidates`).

    Parameters
    ----------
    item : JudgeItem
    agent : int
        1 or 2.
    dimension : str
        One of :data:`~synclib.judge.rubric.DIMENSIONS`.
    """
    lo, hi = SCORE_RANGES[dimension]
    return (
        f"{item.intro.rstrip()}\n{item_transcript(item)}\n\n"
        "Evaluate the participants of this conversation on Sotopia-eval's social "
        f"dimensions:\n{rubric_lines()}\n"
        f"Rate {item.agent_names[agent - 1]} on {dimension} with an integer from {lo} to "
        f"{hi}. Answer with the integer only."
    )


def load_instructions(scenarios: str | os.PathLike | None) -> tuple[str, str]:
    """The instructions to append and where they came from.

    Parameters
    ----------
    scenarios : path, ``"sotopia"``, ``"embedded"`` or None
        A scenarios directory (``judge_instructions.txt`` beside the task files is
        used when present; ``"sotopia"``'s fetched folder holds the paper's), the
        instructions file itself, or ``"embedded"``/None.

    Returns
    -------
    (text, source) : tuple of str
        ``source`` is the file path or ``"embedded"``.
    """
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
