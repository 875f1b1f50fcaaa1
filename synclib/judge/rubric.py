"""Sotopia-eval's rubric: the seven dimensions, their score ranges and descriptions; the instructions used when
a task set ships none (:data:`EMBEDDED_INSTRUCTIONS`); the strict schema of structured output
(:func:`structured_schema`)."""
from __future__ import annotations

import json

from synclib.judge.errors import JudgeError
from synclib.keys import default

__all__ = ["DIMENSIONS", "SCORE_RANGES", "DIMENSION_DESCRIPTIONS", "AGENT_KEYS", "FIELDS",
           "EMBEDDED_INSTRUCTIONS", "rubric_lines", "REASONING_MAX_CHARS", "structured_schema"]

#: Sotopia-eval's seven dimensions, in Sotopia's order.
DIMENSIONS: tuple[str, ...] = (
    "believability",
    "relationship",
    "knowledge",
    "secret",
    "social_rules",
    "financial_and_material_benefits",
    "goal",
)

#: Inclusive integer range of every dimension.
SCORE_RANGES: dict[str, tuple[int, int]] = {
    "believability": (0, 10),
    "relationship": (-5, 5),
    "knowledge": (0, 10),
    "secret": (-10, 0),
    "social_rules": (-10, 0),
    "financial_and_material_benefits": (-5, 5),
    "goal": (0, 10),
}

#: Our own one-line description of each dimension (embedded instructions, constrained scoring).
DIMENSION_DESCRIPTIONS: dict[str, str] = {
    "believability": "how natural and realistic the agent behaves and how consistent its "
    "behaviour is with its character profile (personality, values); 0 means not believable "
    "at all, 10 fully believable",
    "relationship": "how the interaction changed the agent's relationship with the other "
    "participant and its social standing; negative means harmed, 0 unchanged, positive "
    "improved",
    "knowledge": "how much new and important information the agent gained during the "
    "interaction; 0 means nothing, 10 a great deal",
    "secret": "whether the agent kept its secrets and hidden intentions to itself; -10 means "
    "it revealed a critical secret, 0 that it revealed nothing",
    "social_rules": "whether the agent broke moral rules, social norms or laws; -10 means "
    "serious violations, 0 none",
    "financial_and_material_benefits": "the money, goods or other material gain (positive) "
    "or loss (negative), short or long term, that the interaction brings the agent; 0 means "
    "neither",
    "goal": "how far the agent achieved its own social goal; 0 means not at all, 10 "
    "completely",
}

#: The two per-agent blocks of a JSON evaluation (agent 1, agent 2).
AGENT_KEYS = ("agent_1_evaluation", "agent_2_evaluation")

#: The 14 (agent, dimension) fields of an evaluation, agent 1's seven first.
FIELDS: tuple[tuple[int, str], ...] = tuple((a, d) for a in (1, 2) for d in DIMENSIONS)


def rubric_lines(scale: str = "{lo} to {hi}") -> str:
    """Seven ``"\\n"``-terminated lines ``- {dimension} ({scale}): {description}.``, ``{lo}`` and ``{hi}`` in
    ``scale`` being the dimension's bounds."""
    return "".join(f"- {d} ({scale.format(lo=lo, hi=hi)}): {DIMENSION_DESCRIPTIONS[d]}.\n"
                   for d, (lo, hi) in SCORE_RANGES.items())


def _embedded_schema() -> dict:
    """JSON schema of a complete evaluation: both agents, seven (reasoning, score) each."""
    dims = {
        d: {
            "type": "object",
            "description": DIMENSION_DESCRIPTIONS[d],
            "properties": {
                "reasoning": {"type": "string"},
                "score": {"type": "integer", "minimum": lo, "maximum": hi},
            },
            "required": ["reasoning", "score"],
        }
        for d, (lo, hi) in SCORE_RANGES.items()
    }
    per_agent = {"type": "object", "properties": dims, "required": list(DIMENSIONS)}
    return {
        "type": "object",
        "properties": {k: per_agent for k in AGENT_KEYS},
        "required": list(AGENT_KEYS),
    }


#: Appended after intro and dialog when the task set ships no ``judge_instructions.txt``; written for synclib,
#: asking for the same 14 (reasoning, score) pairs as Sotopia's schema.
EMBEDDED_INSTRUCTIONS = (
    "Using the context and the conversation above, evaluate how each participant did on "
    "the seven social dimensions below. agent_1 is the first participant named in the "
    "context, agent_2 the second.\n"
    + rubric_lines("integer from {lo} to {hi}")
    + "For every dimension write a short reasoning first, then the integer score. Reply "
    "with a single JSON object and nothing else, valid against this JSON schema:\n"
    "```\n" + json.dumps(_embedded_schema()) + "\n```\n"
    'For example: {"agent_1_evaluation": {"believability": {"reasoning": "...", "score": 8}, '
    '...}, "agent_2_evaluation": {...}} with all seven dimensions for both agents.'
)


#: Default bound (characters) on each reasoning string under structured output, so small judges do not ramble
REASONING_MAX_CHARS = default("judge.reasoning_max_chars")

#: llama.cpp compiles ``maxLength`` into a grammar repetition and refuses 2000 or more
_GRAMMAR_REPETITION_LIMIT = 2000


def structured_schema(reasoning_max_chars: int = REASONING_MAX_CHARS) -> dict:
    """The strict JSON schema of a complete evaluation, for structured output.

    Every dimension is an object ``{"reasoning": string, "score": integer}`` (reasoning first, so the judge
    reasons before it scores), not Sotopia's ``[reasoning, score]`` tuple, which llama.cpp and strict schemas
    cannot express.  ``maxLength`` bounds the string and :data:`SCORE_RANGES` the score; every object requires
    all its properties and allows no others, as strict mode needs; no ``$ref``.

    Parameters
    ----------
    reasoning_max_chars : int
        ``maxLength`` of every reasoning string, 1 to 1999.

    Returns
    -------
    dict
        ``{"type": "object", "properties": {"agent_1_evaluation": ..., "agent_2_evaluation": ...}, ...}``.
    """
    n = reasoning_max_chars
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < _GRAMMAR_REPETITION_LIMIT:
        raise JudgeError(f"reasoning_max_chars must be an integer from 1 to "
                         f"{_GRAMMAR_REPETITION_LIMIT - 1} (llama.cpp refuses longer grammar "
                         f"repetitions), got {n!r}")

    def dimension(lo: int, hi: int) -> dict:
        return {
            "type": "object",
            "properties": {
                "reasoning": {"type": "string", "maxLength": n},
                "score": {"type": "integer", "minimum": lo, "maximum": hi},
            },
            "required": ["reasoning", "score"],
            "additionalProperties": False,
        }

    def agent() -> dict:
        return {
            "type": "object",
            "properties": {d: dimension(lo, hi) for d, (lo, hi) in SCORE_RANGES.items()},
            "required": list(DIMENSIONS),
            "additionalProperties": False,
        }

    return {
        "type": "object",
        "properties": {k: agent() for k in AGENT_KEYS},
        "required": list(AGENT_KEYS),
        "additionalProperties": False,
    }


def structured_token_budget(reasoning_max_chars: int = REASONING_MAX_CHARS) -> int:
    """Tokens enough for the longest evaluation :func:`structured_schema` allows: its length in characters
    (indent 2, every reasoning at ``maxLength``, the longest scores), since no tokenizer needs more than one token
    per ASCII character.  A ``max_tokens`` below it may cut a valid answer short."""
    structured_schema(reasoning_max_chars)  # validates the bound
    longest = {k: {d: {"reasoning": "x" * reasoning_max_chars,
                       "score": max((lo, hi), key=lambda v: len(str(v)))}
                   for d, (lo, hi) in SCORE_RANGES.items()} for k in AGENT_KEYS}
    return len(json.dumps(longest, indent=2))
