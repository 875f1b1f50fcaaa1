"""Sotopia-eval judging: a judge model scores both agents of every episode of a cube (or of a file of finished
episodes) on Sotopia-eval's seven dimensions; the scores land in ``PAIR.judge.csv`` beside the cube, reduced by
:func:`overall_scores` and :func:`social_performance`.  Command line: :mod:`synclib.cli.evaluate`.

Modules
-------
rubric    the seven dimensions, score ranges, descriptions, embedded instructions, structured-output schema
items     what is judged: :class:`JudgeItem`, and the dialogs of a cube
episodes  finished episodes from a JSON-lines file (Sotopia's export or synclib's own)
prompt    the judge's messages: JSON-mode prompt and repair, constrained questions
parse     strict parsing and field-by-field validation of a JSON answer
cache     the append-only JSON-lines answer cache
options   settings checked once: :class:`JudgeConnection`, :class:`JudgeSampling`, :class:`JudgeOptions`
backends  the OpenAI-compatible HTTP judge and the local judge (constrained scoring on :class:`synclib.engine.Engine`)
evaluate  judging items, cubes and episode files in the two modes (``json``, ``constrained``)
human     human ratings: reading, averaging raters, agreement with a judge (table 4, figure 10)
sotopia_human  Sotopia-π's published human ratings written as episodes, ratings and GPT-4 judge files
table     the score table: columns, reading, writing, overall scores, social performance
errors    :class:`JudgeError`, :class:`JudgeRequestError`

Reading scores is imported with the package; everything that judges is loaded on first use, so that
``from synclib.judge import read_table`` imports neither the backends nor ``synclib.engine``, ``torch``,
``transformers`` or ``httpx``.
"""
from __future__ import annotations

import importlib

from synclib.judge.errors import JudgeError, JudgeRequestError
from synclib.judge.rubric import (DIMENSION_DESCRIPTIONS, DIMENSIONS, EMBEDDED_INSTRUCTIONS,
                                  REASONING_MAX_CHARS, SCORE_RANGES, structured_schema,
                                  structured_token_budget)
from synclib.judge.table import TABLE_COLUMNS, overall_scores, read_table, save_table, social_performance

#: the judging names, loaded from their module on first access (PEP 562)
_LAZY = {
    "JudgeItem": "items", "items_from_cube": "items",
    "SYSTEM_MESSAGE": "prompt", "render_transcript": "prompt", "judge_messages": "prompt",
    "constrained_question": "prompt", "load_instructions": "prompt",
    "extract_json": "parse", "parse_evaluation": "parse",
    "JudgeCache": "cache",
    "OpenAIBackend": "backends", "LocalBackend": "backends", "score_candidates": "backends",
    "JudgeConnection": "options", "JudgeSampling": "options", "JudgeOptions": "options",
    "MODES": "evaluate", "judge_items": "evaluate", "evaluate_cube": "evaluate",
    "evaluate_episodes": "evaluate", "judge_to_file": "evaluate", "request_key": "evaluate",
    "read_episodes": "episodes",
    "read_ratings": "human", "mean_ratings": "human", "paired_scores": "human",
    "agreement": "human", "differences": "human", "within_share": "human", "load_measured": "human",
    "measured_differences": "human",
}

__all__ = [
    "JudgeError", "JudgeRequestError",
    "DIMENSIONS", "SCORE_RANGES", "DIMENSION_DESCRIPTIONS", "EMBEDDED_INSTRUCTIONS",
    "REASONING_MAX_CHARS", "structured_schema", "structured_token_budget",
    "TABLE_COLUMNS", "read_table", "save_table", "overall_scores", "social_performance",
    *_LAZY,
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
