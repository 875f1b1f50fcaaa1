"""Reading a judge's JSON answer, found even inside prose or a code fence: each of the 14 (agent, dimension)
fields must hold a reasoning string and an integer score within range; failures are reported per field."""
from __future__ import annotations

import json
import math
import re
from typing import Any

from synclib.judge.rubric import AGENT_KEYS, DIMENSIONS, FIELDS, SCORE_RANGES

__all__ = ["extract_json", "parse_evaluation"]

_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)


def _looks_like_evaluation(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    keys = set(obj)
    return bool(keys & {*AGENT_KEYS, "agent_1", "agent_2", "evaluations"})


def extract_json(text: str | None) -> dict | None:
    """The evaluation object in a judge's answer, or None: from fenced code blocks, then the whole text, the JSON
    value at every ``{``, the first object with evaluation keys wins; failing that, the first object found."""
    if not text:
        return None
    decoder = json.JSONDecoder()
    first: dict | None = None
    chunks = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for chunk in chunks:
        chunk = chunk.strip()
        starts = [i for i, ch in enumerate(chunk) if ch == "{"]
        for i in starts:
            try:
                obj, _ = decoder.raw_decode(chunk, i)
            except json.JSONDecodeError:
                continue
            if _looks_like_evaluation(obj):
                return obj
            if first is None and isinstance(obj, dict):
                first = obj
    return first


def _as_int(x: Any) -> int | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and math.isfinite(x) and x.is_integer():
        return int(x)
    return None


def parse_evaluation(text: str | None) -> tuple[dict, dict]:
    """Validate a judge's answer field by field.

    Accepts, per dimension, Sotopia's ``[reasoning, score]`` pair (the paper's instructions) or a
    ``{"reasoning": ..., "score": ...}`` object (structured output); per agent, the keys
    ``agent_{i}_evaluation``, ``agent_{i}`` or ``evaluations.agent_{i}``.

    Returns
    -------
    valid : dict
        ``(agent, dimension) -> (reasoning, score)`` for the fields that passed.
    errors : dict
        ``(agent, dimension) -> reason`` for the others (each of the 14 fields is in exactly one dict).
    """
    obj = extract_json(text)
    if obj is None:
        reason = "empty answer" if not (text or "").strip() else "no JSON object found"
        return {}, {k: reason for k in FIELDS}
    if isinstance(obj.get("evaluations"), dict):
        obj = obj["evaluations"]
    valid: dict = {}
    errors: dict = {}
    for a in (1, 2):
        block = obj.get(f"agent_{a}_evaluation", obj.get(f"agent_{a}"))
        for d in DIMENSIONS:
            where = f"agent_{a}_evaluation.{d}"
            if not isinstance(block, dict):
                errors[(a, d)] = f"agent_{a}_evaluation missing or not an object"
                continue
            if d not in block:
                errors[(a, d)] = f"{where} missing"
                continue
            v = block[d]
            if isinstance(v, dict):
                lacking = [k for k in ("reasoning", "score") if k not in v]
                if lacking:
                    errors[(a, d)] = f"{where} object lacks {' and '.join(map(repr, lacking))}"
                    continue
                reasoning, score = v["reasoning"], v["score"]
            elif isinstance(v, (list, tuple)) and len(v) == 2:
                reasoning, score = v
            else:
                errors[(a, d)] = (f"{where} is neither a [reasoning, score] pair nor a "
                                  '{"reasoning": ..., "score": ...} object')
                continue
            lo, hi = SCORE_RANGES[d]
            s = _as_int(score)
            if not isinstance(reasoning, str):
                errors[(a, d)] = f"{where} reasoning is not a string"
            elif s is None:
                errors[(a, d)] = f"{where} score {score!r} is not an integer"
            elif not lo <= s <= hi:
                errors[(a, d)] = f"{where} score {s} out of range [{lo}, {hi}]"
            else:
                valid[(a, d)] = (reasoning, s)
    return valid, errors
