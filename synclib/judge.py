"""Sotopia-eval judging: social performance of simulated episodes.

Every episode of a cube is shown to a judge model, which scores both agents on
Sotopia-eval's seven dimensions.  The scores land in a tidy table saved next to
the cube (``PAIR.judge.csv``); :func:`overall_scores` and
:func:`social_performance` reduce it as the protocol defines.

The judge prompt (protocol, "Social performance")
-------------------------------------------------
One user message after a ``"You are a helpful assistant."`` system message::

    {complete, unmasked intro}            (synclib.scenarios.judge_intro)
    Turn #0: {agent 1} said: "{utterance 0}"
    Turn #1: {agent 2} said: "{utterance 1}"
    ...
    {instructions}

The transcript lines follow Sotopia's own evaluator history (``Turn #n: `` from
its ``Observation`` followed by ``{name} said: "{argument}"`` from its
``AgentAction``).  ``{instructions}`` is ``judge_instructions.txt`` read from the
scenarios directory when it holds one (the paper's text: Sotopia's format
instructions with its JSON schema); otherwise, e.g. for the embedded task set,
:data:`EMBEDDED_INSTRUCTIONS`, our own text with an equivalent JSON schema.

Two modes
---------
``json``
    The judge writes the whole evaluation as JSON (the paper's way).  The JSON is
    found even inside prose or a code fence and every one of the 14
    (agent, dimension) fields is validated: a reasoning string and an integer
    score within range.  When anything fails the judge is asked **once** to
    repair its own answer; what still fails is recorded as missing, with the
    reason and the raw text, never as a made-up score.
``constrained``
    For small local judges.  The judge is asked about one agent and one
    dimension at a time and the score is read from its distribution over the
    allowed integers (see :func:`score_candidates`): valid by construction,
    prefill only, batched.  ``score`` is the most probable integer and
    ``expected`` the probability-weighted mean.

Which mode produced a score is recorded in the ``mode`` column.

Backends
--------
:class:`OpenAIBackend` (any OpenAI-compatible ``/chat/completions`` endpoint:
vLLM, llama.cpp server, hosted APIs; bounded concurrency, timeouts, retries with
exponential backoff) and :class:`LocalBackend` (a ``synclib.models.LoadedModel``).
Both use temperature 0 and a fixed seed.

The API key is read from an environment variable at call time and kept only in
the HTTP client's headers: it is never written to a file, log, table or error
message (error texts are redacted).

Cache
-----
:class:`JudgeCache` is a JSON-lines file keyed on ``sha256(judge id, full
request)``, appended and flushed after every answer: a re-run asks nothing
twice and an interruption loses nothing already paid for.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from synclib.engine import continuation_logprobs

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------
# Dimensions and texts
# --------------------------------------------------------------------------------------

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

#: Our own one-line description of each dimension (used by the embedded
#: instructions and by constrained scoring).
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

SYSTEM_MESSAGE = "You are a helpful assistant."
TURN_TEMPLATE = 'Turn #{turn}: {name} said: "{utterance}"'
INSTRUCTIONS_FILENAME = "judge_instructions.txt"
AGENT_KEYS = ("agent_1_evaluation", "agent_2_evaluation")
MODES = ("json", "constrained")

#: Columns of the tidy score table, in order.
TABLE_COLUMNS = [
    "episode", "task_index", "sim_seed", "agent", "agent_name", "dimension",
    "score", "expected", "reasoning", "judge", "mode", "error", "raw",
]


def _embedded_schema() -> dict:
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


#: The instructions appended after intro and dialog when the task set ships no
#: ``judge_instructions.txt`` (the embedded set).  Written for synclib; asks for
#: the same 14 (reasoning, score) pairs as Sotopia's schema.
EMBEDDED_INSTRUCTIONS = (
    "Using the context and the conversation above, evaluate how each participant did on "
    "the seven social dimensions below. agent_1 is the first participant named in the "
    "context, agent_2 the second.\n"
    + "".join(
        f"- {d} (integer from {lo} to {hi}): {DIMENSION_DESCRIPTIONS[d]}.\n"
        for d, (lo, hi) in SCORE_RANGES.items()
    )
    + "For every dimension write a short reasoning first, then the integer score. Reply "
    "with a single JSON object and nothing else, valid against this JSON schema:\n"
    "```\n" + json.dumps(_embedded_schema()) + "\n```\n"
    'For example: {"agent_1_evaluation": {"believability": {"reasoning": "...", "score": 8}, '
    '...}, "agent_2_evaluation": {...}} with all seven dimensions for both agents.'
)

REPAIR_TEMPLATE = (
    "Your evaluation above could not be used:\n{problems}\n"
    "Reply again with only the corrected JSON object: both agent_1_evaluation and "
    "agent_2_evaluation, each with all seven dimensions ({dims}), each a reasoning string "
    "and an integer score within its range ({ranges})."
)


class JudgeError(Exception):
    """Bad judge input or configuration."""


class JudgeRequestError(JudgeError):
    """A request to the judge failed for good (after the allowed retries)."""


# --------------------------------------------------------------------------------------
# Judge input and prompts
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class JudgeItem:
    """One dialog to judge.

    Attributes
    ----------
    episode, task_index, sim_seed : int
        Identity of the dialog in the cube.
    intro : str
        The complete, unmasked intro (scenario, both backgrounds, both goals).
    agent_names : tuple of 2 str
        Agent 1's and agent 2's full names.
    utterances : tuple of str
        The utterances in order; utterance ``t`` is agent ``t % 2 + 1``'s.
    """

    episode: int
    task_index: int
    sim_seed: int
    intro: str
    agent_names: tuple[str, str]
    utterances: tuple[str, ...]


def render_transcript(agent_names: Sequence[str], utterances: Sequence[str]) -> str:
    """``Turn #t: {name} said: "{utterance}"`` lines, agent 1 at even ``t``."""
    return "\n".join(
        TURN_TEMPLATE.format(turn=t, name=agent_names[t % 2], utterance=u)
        for t, u in enumerate(utterances)
    )


def judge_prompt(item: JudgeItem, instructions: str) -> str:
    """The user message of the JSON-mode judge: intro, dialog, instructions."""
    return "\n".join(
        [item.intro.rstrip("\n"), render_transcript(item.agent_names, item.utterances),
         instructions.strip("\n")]
    )


def judge_messages(item: JudgeItem, instructions: str) -> list[dict]:
    """System + user chat messages of the JSON-mode judge."""
    return [
        {"role": "system", "content": SYSTEM_MESSAGE},
        {"role": "user", "content": judge_prompt(item, instructions)},
    ]


def constrained_question(item: JudgeItem, agent: int, dimension: str) -> str:
    """User message asking for one agent's score on one dimension.

    All 14 questions of an item share everything up to the last sentence (intro,
    dialog, the rubric of all seven dimensions), so that the shared prefix is
    prefilled once per item (see :func:`score_candidates`).
    """
    lo, hi = SCORE_RANGES[dimension]
    rubric = "".join(
        f"- {d} ({a} to {b}): {DIMENSION_DESCRIPTIONS[d]}.\n"
        for d, (a, b) in SCORE_RANGES.items()
    )
    return (
        f"{item.intro.rstrip()}\n{render_transcript(item.agent_names, item.utterances)}\n\n"
        "Evaluate the participants of this conversation on Sotopia-eval's social "
        f"dimensions:\n{rubric}\n"
        f"Rate {item.agent_names[agent - 1]} on {dimension} with an integer from {lo} to "
        f"{hi}. Answer with the integer only."
    )


def load_instructions(scenarios: str | os.PathLike | None) -> tuple[str, str]:
    """The instructions to append and where they came from.

    Parameters
    ----------
    scenarios : path, ``"embedded"`` or None
        A scenarios directory (``judge_instructions.txt`` beside the task files is
        used when present), the instructions file itself, or ``"embedded"``/None.

    Returns
    -------
    (text, source) : tuple of str
        ``source`` is the file path or ``"embedded"``.
    """
    if scenarios is not None and str(scenarios) != "embedded":
        p = Path(scenarios)
        f = p / INSTRUCTIONS_FILENAME if p.is_dir() else p
        if f.is_file():
            text = f.read_text(encoding="utf-8")
            if not text.strip():
                raise JudgeError(f"{f}: judge instructions file is empty")
            return text, str(f)
        if not p.exists():
            raise JudgeError(f"--scenarios {scenarios}: no such file or directory")
    return EMBEDDED_INSTRUCTIONS, "embedded"


# --------------------------------------------------------------------------------------
# Parsing and validation
# --------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)


def _looks_like_evaluation(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    keys = set(obj)
    return bool(keys & {*AGENT_KEYS, "agent_1", "agent_2", "evaluations"})


def extract_json(text: str | None) -> dict | None:
    """The evaluation object in a judge's answer, or None.

    Looks, in order, at fenced code blocks, the whole text, and every ``{`` in
    the text (decoding the longest JSON value starting there).  The first object
    with evaluation keys wins; failing that, the first JSON object found.
    """
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

    Accepts, per dimension, Sotopia's ``[reasoning, score]`` pair or a
    ``{"reasoning": ..., "score": ...}`` object; per agent, the keys
    ``agent_{i}_evaluation``, ``agent_{i}`` or ``evaluations.agent_{i}``.

    Returns
    -------
    valid : dict
        ``(agent, dimension) -> (reasoning, score)`` for the fields that passed.
    errors : dict
        ``(agent, dimension) -> reason`` for the others; every one of the 14
        fields is in exactly one of the two dicts.
    """
    keys = [(a, d) for a in (1, 2) for d in DIMENSIONS]
    obj = extract_json(text)
    if obj is None:
        reason = "empty answer" if not (text or "").strip() else "no JSON object found"
        return {}, {k: reason for k in keys}
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
                reasoning, score = v.get("reasoning"), v.get("score")
            elif isinstance(v, (list, tuple)) and len(v) == 2:
                reasoning, score = v
            else:
                errors[(a, d)] = f"{where} is not a [reasoning, score] pair"
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


def repair_messages(messages: list[dict], raw: str, errors: Mapping) -> list[dict]:
    """The conversation asking the judge, once, to repair its answer ``raw``."""
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


# --------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------

def cache_key(judge_id: str, request: Any) -> str:
    """``sha256`` of the judge id and the full request (messages or prompt)."""
    blob = json.dumps([judge_id, request], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgeCache:
    """Append-only JSON-lines cache of judge answers.

    Each line is ``{"key": sha256, "judge": id, "value": ...}``; a line is
    written and flushed (and fsynced) as soon as its answer arrives.  A torn last
    line (a crash mid-write) is ignored on load.  Thread-safe.

    Parameters
    ----------
    path : path or None
        The file; None keeps the cache in memory only.
    """

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path is not None else None
        self._data: dict[str, Any] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.exists():
            with open(self.path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    try:
                        rec = json.loads(line)
                        self._data[rec["key"]] = rec["value"]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        log.warning("%s:%d: unreadable cache line skipped", self.path, n)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def get(self, key: str) -> Any:
        return self._data.get(key)

    def put(self, key: str, judge_id: str, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            if self.path is None:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"key": key, "judge": judge_id, "value": value}, ensure_ascii=False)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())


# --------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------

class OpenAIBackend:
    """An OpenAI-compatible chat-completions endpoint.

    Parameters
    ----------
    base_url : str
        The API root, e.g. ``http://localhost:8000/v1``; requests go to
        ``{base_url}/chat/completions``.
    model : str
        The served model name; also the judge id in tables and cache keys.
    api_key_env : str
        Environment variable holding the API key (read now; when unset or empty
        no ``Authorization`` header is sent, as a local vLLM needs none).
    timeout : float
        Seconds allowed for connecting and for each read.
    max_retries : int
        Retries after the first attempt on 429, 5xx, timeouts and dropped
        connections; other errors are not retried.
    backoff, max_backoff : float
        Wait ``min(backoff * 2**attempt, max_backoff)`` seconds before retry
        ``attempt + 1`` (a 429's ``Retry-After`` is honoured up to ``max_backoff``).
    temperature, seed, max_tokens : sampling settings sent with every request.
    """

    RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY",
                 timeout: float = 120.0, max_retries: int = 5, backoff: float = 1.0,
                 max_backoff: float = 60.0, temperature: float = 0.0, seed: int = 0,
                 max_tokens: int | None = None, sleep: Callable[[float], None] = time.sleep):
        import httpx

        if not base_url or not base_url.startswith(("http://", "https://")):
            raise JudgeError(f"--judge-url must be an http(s) URL, got {base_url!r}")
        if not model:
            raise JudgeError("--judge-model must name the served model")
        if max_retries < 0 or timeout <= 0:
            raise JudgeError("max_retries must be >= 0 and timeout > 0")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.temperature, self.seed, self.max_tokens = temperature, seed, max_tokens
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
        self._sleep = sleep
        key = os.environ.get(api_key_env) or ""
        if not key:
            log.warning("environment variable %s is not set: sending requests without an "
                        "API key", api_key_env)
        self._secret = key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers)
        self.requests_sent = 0
        self._count_lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIBackend(url={self.url!r}, model={self.model!r}, key_env={self.api_key_env!r})"

    @property
    def judge_id(self) -> str:
        """The judge's name: the served model."""
        return self.model

    @property
    def settings(self) -> dict:
        """Everything besides the messages that changes the answer (part of the cache key)."""
        return {"temperature": self.temperature, "seed": self.seed, "max_tokens": self.max_tokens}

    def redact(self, text: str) -> str:
        """``text`` with the API key replaced by ``***``."""
        return text.replace(self._secret, "***") if self._secret else text

    def close(self) -> None:
        self._client.close()

    def complete(self, messages: list[dict]) -> str:
        """The assistant's answer to ``messages`` (retrying as documented).

        Raises
        ------
        JudgeRequestError
            With a redacted reason, when the request failed for good.
        """
        import httpx

        body: dict = {"model": self.model, "messages": messages,
                      "temperature": self.temperature, "seed": self.seed}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        last = ""
        for attempt in range(self.max_retries + 1):
            wait = min(self.backoff * 2 ** attempt, self.max_backoff)
            with self._count_lock:
                self.requests_sent += 1
            try:
                r = self._client.post(self.url, json=body)
            except httpx.TransportError as e:  # timeouts, refused/dropped connections
                last = f"{type(e).__name__}: {e}"
            else:
                if r.status_code == 200:
                    try:
                        content = r.json()["choices"][0]["message"].get("content")
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                        raise JudgeRequestError(self.redact(
                            f"malformed response from {self.url}: {type(e).__name__}: "
                            f"{r.text[:300]!r}")) from None
                    return content or ""
                last = f"HTTP {r.status_code}: {r.text[:300]}"
                if r.status_code not in self.RETRY_STATUS:
                    raise JudgeRequestError(self.redact(f"{self.url}: {last}")) from None
                ra = r.headers.get("retry-after")
                if ra:
                    try:
                        wait = min(max(wait, float(ra)), self.max_backoff)
                    except ValueError:
                        pass
            if attempt < self.max_retries:
                log.info("judge request failed (%s); retry %d/%d in %.2fs",
                         self.redact(last), attempt + 1, self.max_retries, wait)
                self._sleep(wait)
        raise JudgeRequestError(self.redact(
            f"{self.url}: gave up after {self.max_retries + 1} attempts; last error: {last}"))


class LocalBackend:
    """A local causal LM (a ``synclib.models.LoadedModel``) as judge.

    Parameters
    ----------
    loaded : LoadedModel
        Needs ``.name``, ``.model``, ``.tokenizer``, ``.device`` and
        ``.chat_prompt(user_text, system=None)``.
    max_new_tokens : int
        Limit of a JSON-mode answer.
    batch_size : int
        Rows per forward pass in constrained scoring.
    seed : int
        Torch seed set before every generation (greedy decoding, so only for
        completeness).
    """

    def __init__(self, loaded: Any, max_new_tokens: int = 1024, batch_size: int = 16,
                 seed: int = 0):
        self.loaded = loaded
        self.max_new_tokens, self.batch_size, self.seed = max_new_tokens, batch_size, seed
        self.requests_sent = 0

    @property
    def judge_id(self) -> str:
        return str(getattr(self.loaded, "name", "local"))

    @property
    def settings(self) -> dict:
        return {"temperature": 0.0, "seed": self.seed, "max_tokens": self.max_new_tokens}

    def redact(self, text: str) -> str:
        return text

    def close(self) -> None:
        pass

    def _render(self, messages: list[dict]) -> str:
        if len(messages) == 2 and messages[0]["role"] == "system":
            return self.loaded.chat_prompt(messages[1]["content"], system=messages[0]["content"])
        tok = self.loaded.tokenizer
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # no template: fold the conversation into one user message
        text = "\n\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages[1:])
        return self.loaded.chat_prompt(text, system=messages[0]["content"])

    def complete(self, messages: list[dict]) -> str:
        """Greedy free generation of the answer to ``messages``."""
        import torch

        self.requests_sent += 1
        tok, model = self.loaded.tokenizer, self.loaded.model
        text = self._render(messages)
        encode = getattr(self.loaded, "encode", None)
        ids = list(encode(text)) if encode else tok(text, add_special_tokens=False).input_ids
        inp = torch.tensor([ids], device=self.loaded.device)
        torch.manual_seed(self.seed)
        pad = getattr(self.loaded, "pad_token_id", None)
        pad = pad if pad is not None else (tok.pad_token_id if tok.pad_token_id is not None
                                           else tok.eos_token_id)
        stop = sorted(getattr(self.loaded, "stop_token_ids", ()) or ()) or None
        with torch.no_grad():
            out = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp),
                                 do_sample=False, max_new_tokens=self.max_new_tokens,
                                 pad_token_id=pad, eos_token_id=stop)
        return tok.decode(out[0, inp.shape[1]:], skip_special_tokens=True)

    def score(self, prompts: list[str], candidates: list[list[str]]) -> list[np.ndarray]:
        """Log-probabilities of complete candidate answers (see :func:`score_candidates`)."""
        self.requests_sent += 1
        return score_candidates(self.loaded.model, self.loaded.tokenizer, prompts, candidates,
                                device=self.loaded.device, batch_size=self.batch_size,
                                encode=getattr(self.loaded, "encode", None))


def _terminator_id(tokenizer) -> int:
    """The token that ends an assistant turn.

    Read from the chat template (the first token after the content of a rendered
    assistant message: ``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``,
    ``</s>``...); the eos token when there is no template; a newline as last resort.
    """
    marker = "QXZJUDGEANSWER"
    if getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}],
                tokenize=False)
            after = text[text.index(marker) + len(marker):]
            ids = tokenizer(after, add_special_tokens=False).input_ids if after else []
            if ids and ids[0] in set(getattr(tokenizer, "all_special_ids", [])):
                return int(ids[0])
        except Exception:  # templates that reject this conversation: fall back
            pass
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    ids = tokenizer("\n", add_special_tokens=False).input_ids
    if not ids:
        raise JudgeError("tokenizer has neither an eos token nor a newline token")
    return int(ids[-1])


def _candidate_ids(tokenizer, encode, prompt_ids: list[int], prompt: str, cand: str) -> list[int]:
    """Token ids of ``cand`` as it would be tokenized right after ``prompt``."""
    joint = list(encode(prompt + cand))
    if joint[: len(prompt_ids)] == prompt_ids and len(joint) > len(prompt_ids):
        return joint[len(prompt_ids):]
    return list(tokenizer(cand, add_special_tokens=False).input_ids)


def _has_sliding_window(model) -> bool:
    """Whether any attention layer of ``model`` uses a sliding window."""
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        return "sliding_attention" in types
    return getattr(cfg, "sliding_window", None) is not None


def score_candidates(model, tokenizer, prompts: Sequence[str],
                     candidates: Sequence[Sequence[str]], device=None,
                     batch_size: int = 16, encode: Callable[[str], list] | None = None,
                     terminator: int | None = None) -> list[np.ndarray]:
    """Full-sequence log-probability of each candidate answer after each prompt.

    Why full sequences: the allowed scores include multi-token strings ("10",
    "-5", "-10" are two or three tokens in most vocabularies), so the next-token
    distribution alone cannot tell "1" from "10".  Each candidate is scored as
    ``log P(candidate tokens + terminator | prompt)`` where the terminator is the
    end-of-turn token of the chat template (:func:`_terminator_id`): a complete
    answer, so that "1" and "10" are disjoint events and every allowed integer
    gets a proper score.  Normalising over the candidates gives the judge's
    distribution restricted to valid answers.

    Cost (prefill only, no generation), in three batched stages:

    1. the longest token prefix shared by all ``prompts`` (intro, dialog and
       rubric when the prompts are the 14 questions of one episode) is
       prefilled once;
    2. the prompts' remaining tokens, ``batch_size`` prompts per pass, left
       padded, over copies of the prefix's key/value cache; the last column
       gives each prompt's first answer token distribution;
    3. the candidates' remaining tokens, ``batch_size`` (prompt, candidate) rows
       per pass, over the stage-2 cache of their prompt
       (:func:`synclib.engine.continuation_logprobs`, shared with the ToM word
       scores); an attention mask hides stage 2's padding and position ids
       continue each prompt's own length.

    Under sliding-window attention (Gemma-3) stage 1 is skipped: the window counts
    cache columns, and the padding between a shared prefix and a shorter prompt's
    own tokens would take window slots.

    Parameters
    ----------
    model : transformers causal LM
    tokenizer : its tokenizer
    prompts : sequence of P str
        Complete model inputs (chat template applied), ending where the answer
        starts.
    candidates : sequence of P sequences of str
        The allowed answers of each prompt.
    device : torch device, optional
    batch_size : int
        Rows per forward pass (stages 2 and 3).
    encode : callable, optional
        ``text -> token ids`` (e.g. ``LoadedModel.encode``, which adds BOS once);
        default: the tokenizer without special tokens (the template writes them).
    terminator : int, optional
        Token id ending an answer; default :func:`_terminator_id`.

    Returns
    -------
    list of P float64 arrays
        ``out[p][c]`` = log-probability of ``candidates[p][c]`` (unnormalised
        over candidates).
    """
    import torch
    from transformers import DynamicCache

    if len(prompts) != len(candidates):
        raise JudgeError("score_candidates: prompts and candidates differ in length")
    if batch_size < 1:
        raise JudgeError(f"score_candidates: batch_size must be >= 1, got {batch_size}")
    if not prompts:
        return []
    device = device if device is not None else next(model.parameters()).device
    term = _terminator_id(tokenizer) if terminator is None else int(terminator)
    if encode is None:
        def encode(text: str) -> list:
            return tokenizer(text, add_special_tokens=False).input_ids
    pids = [list(encode(p)) for p in prompts]
    if min(map(len, pids)) == 0:
        raise JudgeError("score_candidates: empty prompt")
    lcp = 0
    for col in zip(*pids):
        if any(c != col[0] for c in col):
            break
        lcp += 1
    lcp = min(lcp, min(map(len, pids)) - 1)  # every prompt keeps >= 1 own token
    if _has_sliding_window(model):
        # a sliding window counts cache columns: padding between the shared prefix and a
        # shorter prompt's own tokens would take window slots, so no shared prefix here
        lcp = 0
    answers = [[_candidate_ids(tokenizer, encode, ids, prompt, c) + [term] for c in candidates[p]]
               for p, (prompt, ids) in enumerate(zip(prompts, pids))]
    out = [np.zeros(len(c)) for c in candidates]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else term

    def left_padded(seqs: list[list[int]]):
        """Left padding: every row's last token in the last column, so that the
        answers' tokens follow each prompt without a gap (also for a sliding window)."""
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = torch.tensor(s, device=device)
            mask[i, width - len(s):] = 1
        return ids, mask

    def forward(ids, mask, pos, cache, keep):
        kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=pos,
                      past_key_values=cache, use_cache=True)
        try:
            res = model(**kwargs, logits_to_keep=keep)
            return res.logits.float(), res.past_key_values
        except TypeError:  # a model without logits_to_keep
            res = model(**kwargs)
            return res.logits[:, keep].float(), res.past_key_values

    with torch.no_grad():
        # stage 1: the shared prefix
        prefix_cache = None
        if lcp > 0:
            pre = torch.tensor([pids[0][:lcp]], device=device)
            # a plain DynamicCache, every column kept (as continuation_logprobs needs)
            prefix_cache = model(input_ids=pre, past_key_values=DynamicCache(), use_cache=True).past_key_values
        for p0 in range(0, len(prompts), batch_size):
            # stage 2: each prompt's own tokens
            group = list(range(p0, min(p0 + batch_size, len(prompts))))
            sufs = [pids[p][lcp:] for p in group]
            ids2, mask2 = left_padded(sufs)
            n, width = ids2.shape
            cache = DynamicCache()
            if prefix_cache is not None:
                cache = copy.deepcopy(prefix_cache)
                cache.batch_repeat_interleave(n)
            full_mask2 = torch.cat([torch.ones((n, lcp), dtype=torch.long, device=device), mask2], 1)
            pos2 = lcp + (mask2.cumsum(-1) - 1).clamp(min=0)
            logits2, cache = forward(ids2, full_mask2, pos2, cache, torch.tensor([width - 1], device=device))
            last_logp = torch.log_softmax(logits2[:, -1], -1)  # (n, vocab), after each prompt
            for i, p in enumerate(group):
                firsts = torch.tensor([a[0] for a in answers[p]], device=device)
                out[p] += last_logp[i, firsts].double().cpu().numpy()
            # stage 3: the answers' remaining tokens (the terminator at least), over the
            # stage-2 cache; positions continue each prompt's own length
            where = [(p, c) for p in group for c in range(len(answers[p]))]
            lens = torch.tensor([lcp + len(x) for x in sufs], device=device)
            rest, _ = continuation_logprobs(model, cache, full_mask2, lens,
                                            [(group.index(p), answers[p][c]) for p, c in where],
                                            pad, batch_size)
            for (p, c), lp in zip(where, rest):
                out[p][c] += lp
    return out


# --------------------------------------------------------------------------------------
# Judging
# --------------------------------------------------------------------------------------

def _row(item: JudgeItem, agent: int, dim: str, judge: str, mode: str, score=None,
         expected=None, reasoning: str = "", error: str = "", raw: str = "") -> dict:
    return {
        "episode": item.episode, "task_index": item.task_index, "sim_seed": item.sim_seed,
        "agent": agent, "agent_name": item.agent_names[agent - 1], "dimension": dim,
        "score": score, "expected": expected, "reasoning": reasoning, "judge": judge,
        "mode": mode, "error": error, "raw": raw,
    }


def _cached_complete(backend, cache: JudgeCache, messages: list[dict]) -> str:
    key = cache_key(backend.judge_id, {"settings": backend.settings, "messages": messages})
    hit = cache.get(key)
    if hit is not None:
        return hit
    text = backend.complete(messages)
    cache.put(key, backend.judge_id, text)
    return text


def judge_item_json(item: JudgeItem, backend, cache: JudgeCache, instructions: str) -> list[dict]:
    """The 14 rows of one dialog judged in JSON mode (one repair at most)."""
    judge = backend.judge_id
    if not item.utterances:
        return [_row(item, a, d, judge, "json", error="episode has no utterances")
                for a in (1, 2) for d in DIMENSIONS]
    messages = judge_messages(item, instructions)
    try:
        raw = _cached_complete(backend, cache, messages)
    except JudgeRequestError as e:
        msg = backend.redact(f"request failed: {e}")
        return [_row(item, a, d, judge, "json", error=msg) for a in (1, 2) for d in DIMENSIONS]
    valid, errors = parse_evaluation(raw)
    raw_all = raw
    if errors:
        try:
            raw2 = _cached_complete(backend, cache, repair_messages(messages, raw, errors))
        except JudgeRequestError as e:
            raw2, note = None, backend.redact(f"; repair request failed: {e}")
        else:
            note = " (still invalid after one repair)"
        if raw2 is not None:
            valid2, errors2 = parse_evaluation(raw2)
            raw_all = f"{raw}\n----- repair -----\n{raw2}"
            for k in list(errors):  # the repaired answer fills what the first lacked
                if k in valid2:
                    valid[k] = valid2.pop(k)
                    del errors[k]
                else:
                    errors[k] = f"{errors[k]}; repair: {errors2[k]}"
        errors = {k: v + note for k, v in errors.items()}
    rows = []
    for a in (1, 2):
        for d in DIMENSIONS:
            if (a, d) in valid:
                reasoning, s = valid[(a, d)]
                rows.append(_row(item, a, d, judge, "json", score=s,
                                 reasoning=backend.redact(reasoning)))
            else:
                rows.append(_row(item, a, d, judge, "json", error=errors[(a, d)],
                                 raw=backend.redact(raw_all)))
    return rows


def judge_item_constrained(item: JudgeItem, backend: LocalBackend, cache: JudgeCache) -> list[dict]:
    """The 14 rows of one dialog judged in constrained mode."""
    judge = backend.judge_id
    keys = [(a, d) for a in (1, 2) for d in DIMENSIONS]
    if not item.utterances:
        return [_row(item, a, d, judge, "constrained", error="episode has no utterances")
                for a, d in keys]
    prompts, cands, ckeys = [], [], []
    for a, d in keys:
        lo, hi = SCORE_RANGES[d]
        prompts.append(backend.loaded.chat_prompt(constrained_question(item, a, d),
                                                  system=SYSTEM_MESSAGE))
        cands.append([str(v) for v in range(lo, hi + 1)])
        ckeys.append(cache_key(judge, {"mode": "constrained", "prompt": prompts[-1],
                                       "candidates": cands[-1]}))
    todo = [i for i, k in enumerate(ckeys) if k not in cache]
    try:
        if todo:
            scored = backend.score([prompts[i] for i in todo], [cands[i] for i in todo])
            for i, lp in zip(todo, scored):
                cache.put(ckeys[i], judge, [float(x) for x in lp])
    except Exception as e:  # never stop the batch
        log.exception("constrained scoring failed for episode %s seed %s", item.episode,
                      item.sim_seed)
        return [_row(item, a, d, judge, "constrained", error=f"scoring failed: {type(e).__name__}: {e}")
                for a, d in keys]
    rows = []
    for (a, d), c, k in zip(keys, cands, ckeys):
        lp = np.asarray(cache.get(k), dtype=float)
        values = np.array([int(v) for v in c])
        p = np.exp(lp - lp.max())
        p /= p.sum()
        rows.append(_row(item, a, d, judge, "constrained", score=int(values[int(np.argmax(lp))]),
                         expected=float(p @ values)))
    return rows


def judge_items(items: Sequence[JudgeItem], backend, mode: str = "json",
                cache: JudgeCache | None = None, instructions: str = EMBEDDED_INSTRUCTIONS,
                concurrency: int = 8, progress: bool = True) -> pd.DataFrame:
    """Judge every item; never stops on a failed item.

    Parameters
    ----------
    items : sequence of JudgeItem
    backend : OpenAIBackend or LocalBackend
    mode : ``"json"`` or ``"constrained"`` (local backends only)
    cache : JudgeCache, optional (in memory when None)
    instructions : str
        Appended after intro and dialog in JSON mode.
    concurrency : int
        Items in flight at once (threads) for an HTTP backend; local backends
        run one item at a time.
    progress : bool
        Show a tqdm bar on stderr.

    Returns
    -------
    pandas.DataFrame
        14 rows per item, columns :data:`TABLE_COLUMNS`, sorted by episode,
        sim seed, agent and dimension order.
    """
    from tqdm.auto import tqdm

    if mode not in MODES:
        raise JudgeError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "constrained" and not hasattr(backend, "score"):
        raise JudgeError("constrained mode needs a local judge model (next-token "
                         "distributions); an HTTP endpoint supports --mode json only")
    if concurrency < 1:
        raise JudgeError(f"concurrency must be >= 1, got {concurrency}")
    cache = cache if cache is not None else JudgeCache(None)

    def one(item: JudgeItem) -> list[dict]:
        try:
            if mode == "json":
                return judge_item_json(item, backend, cache, instructions)
            return judge_item_constrained(item, backend, cache)
        except Exception as e:  # a bug or an unforeseen failure: record, go on
            log.exception("judging episode %s seed %s failed", item.episode, item.sim_seed)
            msg = backend.redact(f"{type(e).__name__}: {e}")
            return [_row(item, a, d, backend.judge_id, mode, error=msg)
                    for a in (1, 2) for d in DIMENSIONS]

    rows: list[dict] = []
    bar = tqdm(total=len(items), desc=f"judging ({mode})", unit="episode", disable=not progress)
    workers = concurrency if isinstance(backend, OpenAIBackend) else 1
    try:
        if workers == 1:
            for item in items:
                rows += one(item)
                bar.update()
        else:
            with cf.ThreadPoolExecutor(max_workers=workers) as pool:
                for fut in cf.as_completed([pool.submit(one, it) for it in items]):
                    rows += fut.result()
                    bar.update()
    finally:
        bar.close()
    return _tidy(rows)


def _tidy(rows: list[dict]) -> pd.DataFrame:
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


# --------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------

def overall_scores(table: pd.DataFrame, column: str = "score") -> pd.DataFrame:
    """Each agent's overall score: the mean of its 7 dimension scores.

    Parameters
    ----------
    table : DataFrame from :func:`judge_items` or :func:`read_table`
    column : ``"score"`` or ``"expected"`` (constrained mode)

    Returns
    -------
    DataFrame
        One row per (episode, task_index, sim_seed, agent) with ``overall``
        (NaN unless all 7 dimensions have a score) and ``n_scored``.
    """
    keys = ["episode", "task_index", "sim_seed", "agent"]
    t = table.assign(_v=pd.to_numeric(table[column], errors="coerce").astype(float))
    g = t.groupby(keys, sort=True)["_v"]
    out = pd.DataFrame({"n_scored": g.count(), "overall": g.mean()}).reset_index()
    out.loc[out["n_scored"] < len(DIMENSIONS), "overall"] = np.nan
    return out


def social_performance(table: pd.DataFrame, column: str = "score",
                       by_seed: bool = False) -> float | pd.Series:
    """The pair's social performance (protocol, "Social performance").

    The mean of the agents' overall scores over agents and episodes within each
    simulation seed, then averaged over seeds.  Agents with a missing dimension
    are left out (they have no overall score).

    Returns
    -------
    float, or a Series indexed by sim_seed when ``by_seed``.
    """
    ov = overall_scores(table, column)
    per_seed = ov.groupby("sim_seed")["overall"].mean()
    return per_seed if by_seed else float(per_seed.mean())


# --------------------------------------------------------------------------------------
# Cubes
# --------------------------------------------------------------------------------------

def _persona_name(p: Any) -> str:
    return f"{getattr(p, 'first_name', '')} {getattr(p, 'last_name', '')}".strip()


def items_from_cube(cube: Any, tasks: Any, intro: Callable[[Any], str] | None = None) -> list[JudgeItem]:
    """The dialogs of a cube as :class:`JudgeItem` objects.

    Parameters
    ----------
    cube : path or xarray.Dataset
        Needs ``text_a``, ``text_b`` (episode, sim_seed, round), ``n_utterances``
        (episode, sim_seed) and the ``task_index`` episode coordinate.
        Utterance ``2k`` is ``text_a[..., k]``, ``2k+1`` is ``text_b[..., k]``.
    tasks : TaskSet
        The task set the cube was simulated from (``.tasks``, each with
        ``.index`` and ``.agents``).
    intro : callable, optional
        ``task -> str``; default ``synclib.scenarios.judge_intro``.

    Returns
    -------
    list of JudgeItem, ordered by episode then sim seed.
    """
    import xarray as xr

    if intro is None:
        from synclib.scenarios import judge_intro as intro
    ds = cube if isinstance(cube, xr.Dataset) else xr.open_dataset(cube)
    where = cube if not isinstance(cube, xr.Dataset) else "cube"
    for v in ("text_a", "text_b", "n_utterances", "task_index"):
        if v not in ds.variables:
            raise JudgeError(f"{where}: variable or coordinate {v!r} is missing")
    by_index = {int(t.index): t for t in tasks.tasks}
    text_a = ds["text_a"].transpose("episode", "sim_seed", "round").values
    text_b = ds["text_b"].transpose("episode", "sim_seed", "round").values
    n_utt = ds["n_utterances"].transpose("episode", "sim_seed").values
    episodes = ds["episode"].values if "episode" in ds.coords else np.arange(ds.sizes["episode"])
    seeds = ds["sim_seed"].values if "sim_seed" in ds.coords else np.arange(ds.sizes["sim_seed"])
    task_idx = ds["task_index"].values
    items = []
    for e, ep in enumerate(episodes):
        ti = int(task_idx[e])
        if ti not in by_index:
            raise JudgeError(f"{where}: episode {ep} has task_index {ti}, which is not in the "
                             f"task set ({len(by_index)} tasks)")
        task = by_index[ti]
        names = tuple(_persona_name(p) for p in task.agents)
        text = intro(task)
        for s, seed in enumerate(seeds):
            n = n_utt[e, s]
            n = 0 if not np.isfinite(n) or n < 0 else int(n)
            utts = tuple(str((text_a if t % 2 == 0 else text_b)[e, s, t // 2]) for t in range(n))
            items.append(JudgeItem(int(ep), ti, int(seed), text, names, utts))
    if not isinstance(cube, xr.Dataset):
        ds.close()
    return items


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------

def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``synclib evaluate``."""
    parser.add_argument("cube", help="the activation cube (.nc) whose dialogs are judged")
    parser.add_argument("--scenarios", default="embedded",
                        help="the task set the cube was simulated from: a Sotopia-format "
                             "directory or 'embedded' (default). A judge_instructions.txt "
                             "in the directory is appended to the prompt; otherwise "
                             "synclib's own instructions are")
    parser.add_argument("--judge-model", required=True,
                        help="served model name at --judge-url, or, without --judge-url, a "
                             "local judge for synclib.models.load_model (e.g. smollm2-135m)")
    parser.add_argument("--judge-url", default=None,
                        help="base URL of an OpenAI-compatible API, e.g. "
                             "http://localhost:8000/v1 (requests go to URL/chat/completions)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY",
                        help="environment variable holding the API key (default "
                             "OPENAI_API_KEY; unset means no key is sent). The key itself is "
                             "never written anywhere")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="requests in flight at once (HTTP judge; default 8)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds to wait to connect and for each read (default 300)")
    parser.add_argument("--max-retries", type=int, default=5,
                        help="retries on 429/5xx/timeouts/dropped connections, with "
                             "exponential backoff (default 5)")
    parser.add_argument("--mode", choices=MODES, default=None,
                        help="json: the judge writes the whole evaluation (default for "
                             "--judge-url); constrained: one agent and dimension at a time, "
                             "score read from the judge's distribution over the allowed "
                             "integers (local judges only; their default)")
    parser.add_argument("--seed", type=int, default=0, help="judge seed (default 0)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="answer length limit (HTTP default: the server's; local: 1024)")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="rows per forward pass in constrained scoring (default 16)")
    parser.add_argument("--device", default=None, help="device of a local judge (default: auto)")
    parser.add_argument("--limit", type=int, default=None,
                        help="judge only the first N dialogs (episode x sim seed)")
    parser.add_argument("--out", default=None,
                        help="output CSV (default: CUBE with .judge.csv instead of .nc)")
    parser.add_argument("--cache", default=None,
                        help="answer cache, JSON lines (default: CUBE with .judge-cache.jsonl)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def evaluate_cube(cube: str | os.PathLike, *, scenarios: str | os.PathLike = "embedded",
                  judge_model: str, judge_url: str | None = None,
                  api_key_env: str = "OPENAI_API_KEY", mode: str | None = None,
                  concurrency: int = 8, out: str | os.PathLike | None = None,
                  cache: str | os.PathLike | None = None, device: str | None = None,
                  limit: int | None = None, timeout: float = 300.0, max_retries: int = 5,
                  seed: int = 0, max_tokens: int | None = None, batch_size: int = 16,
                  progress: bool = True, log=None) -> pd.DataFrame:
    """Judge every dialog of a cube and write the tidy table (``CUBE.judge.csv``).

    The library form of ``synclib evaluate`` (same parameters as its options).
    ``mode`` defaults to ``json`` with ``judge_url`` and ``constrained`` for a
    local judge.  Answers are cached in ``cache`` (default
    ``CUBE.judge-cache.jsonl``), so an interrupted call loses nothing paid for.
    Returns the table that was written.
    """
    from synclib.scenarios import load_tasks

    log = log or (lambda msg: print(msg, file=sys.stderr))
    cube = Path(cube)
    if not cube.is_file():
        raise JudgeError(f"cube {cube} does not exist")
    mode = mode or ("json" if judge_url else "constrained")
    if mode not in MODES:
        raise JudgeError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "constrained" and judge_url:
        raise JudgeError("mode 'constrained' needs a local judge (no judge_url): an HTTP "
                         "endpoint gives no score distributions")
    tasks = load_tasks(scenarios)
    instructions, source = load_instructions(scenarios)
    items = items_from_cube(cube, tasks)
    if limit is not None:
        items = items[:limit]
    if judge_url:
        backend: Any = OpenAIBackend(judge_url, judge_model, api_key_env, timeout=timeout,
                                     max_retries=max_retries, seed=seed, max_tokens=max_tokens)
    else:
        from synclib.models import load_model

        backend = LocalBackend(load_model(judge_model, device=device),
                               max_new_tokens=max_tokens or 1024, batch_size=batch_size, seed=seed)
    out = Path(out) if out else cube.with_suffix(".judge.csv")
    cache_ = JudgeCache(cache if cache else cube.with_suffix(".judge-cache.jsonl"))
    what = f"instructions: {source}" if mode == "json" else "one question per agent and dimension"
    log(f"judging {len(items)} dialogs with {backend.judge_id} ({mode} mode, {what}); "
        f"cache {cache_.path} holds {len(cache_)} answers")
    try:
        table = judge_items(items, backend, mode=mode, cache=cache_, instructions=instructions,
                            concurrency=concurrency, progress=progress)
    finally:
        backend.close()
    save_table(table, out)
    missing = int(table["score"].isna().sum())
    log(f"wrote {out}: {len(table) - missing} scores, {missing} missing; "
        f"social performance {social_performance(table):.3f}; {backend.requests_sent} judge calls")
    return table


def run(args: argparse.Namespace) -> int:
    """``synclib evaluate``: judge a cube and write ``CUBE.judge.csv``."""
    try:
        evaluate_cube(args.cube, scenarios=args.scenarios, judge_model=args.judge_model,
                      judge_url=args.judge_url, api_key_env=args.api_key_env, mode=args.mode,
                      concurrency=args.concurrency, out=args.out, cache=args.cache,
                      device=args.device, limit=args.limit, timeout=args.timeout,
                      max_retries=args.max_retries, seed=args.seed, max_tokens=args.max_tokens,
                      batch_size=args.batch_size, progress=not args.no_progress)
    except JudgeError as exc:
        raise SystemExit(f"synclib evaluate: {exc}") from None
    return 0
