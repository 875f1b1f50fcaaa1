"""Judge backends: :class:`OpenAIBackend` (any OpenAI-compatible ``/chat/completions`` endpoint: vLLM,
llama.cpp server, hosted APIs) and :class:`LocalBackend` (a ``synclib.models.LoadedModel``), both at
temperature 0 with a fixed seed.  Only a local backend can ``score`` (constrained mode, :func:`score_candidates`).

The API key is read from an environment variable and kept only in the HTTP client's headers: never written to
a file, log, table or error message (error texts are redacted).
"""
from __future__ import annotations

import copy
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from synclib.engine import Engine
from synclib.judge.errors import JudgeError, JudgeRequestError
from synclib.judge.options import LOCAL_MAX_NEW_TOKENS, JudgeConnection, JudgeOptions, JudgeSampling
from synclib.judge.rubric import structured_schema, structured_token_budget

__all__ = ["OpenAIBackend", "LocalBackend", "score_candidates", "RESPONSE_FORMAT_NAME"]

log = logging.getLogger(__name__)

#: the engine session holding the prompts' shared prefix during :func:`score_candidates`
_PREFIX_SESSION = ("synclib.judge", "shared prompt prefix")

#: ``response_format.json_schema.name`` of the structured requests
RESPONSE_FORMAT_NAME = "sotopia_evaluation"

#: a server's refusal of ``response_format``: HTTP 400/422 whose text names the format, schema or grammar
_REFUSAL_STATUS = frozenset({400, 422})
_REFUSAL_TEXT = re.compile(r"response_format|json_schema|schema|grammar", re.IGNORECASE)


class _StructuredRefused(Exception):
    """The server refused the request's ``response_format`` (internal to the backend)."""


class OpenAIBackend:
    """An OpenAI-compatible chat-completions endpoint.

    Parameters
    ----------
    connection : JudgeConnection
        ``url`` (the API root, e.g. ``http://localhost:8000/v1``), the served model (also the judge id in
        tables and cache keys), the API key's environment variable (read now; unset or empty: no
        ``Authorization`` header), timeout, retries and backoff.
    sampling : JudgeSampling, optional
        ``temperature``, ``seed``, ``max_tokens`` (None: the server's limit; under structured output a value
        below :func:`~synclib.judge.rubric.structured_token_budget` is warned about), ``structured``,
        ``reasoning_max_chars``.
    sleep : callable
        Waits between retries (``time.sleep``; tests pass a stand-in).

    ``sampling.structured`` (default) sends ``response_format = {"type": "json_schema", "json_schema":
    {"name": "sotopia_evaluation", "schema": ..., "strict": true}}`` with
    :func:`~synclib.judge.rubric.structured_schema`: one object ``{"reasoning", "score"}`` per dimension,
    reasoning at most ``reasoning_max_chars`` characters, score an integer in range; servers that enforce it
    (vLLM, llama.cpp) can only answer with a valid evaluation.  False: plain JSON mode.
    Retries: ``connection.max_retries`` more on :attr:`RETRY_STATUS`, timeouts and dropped connections,
    waiting ``min(backoff * 2**attempt, max_backoff)`` seconds (``Retry-After`` honoured up to
    ``max_backoff``); other errors are not retried.

    Notes
    -----
    The instructions are sent unchanged; the paper's describe Sotopia's ``[reasoning, score]`` tuples, while
    the schema forces the object form (llama.cpp refuses ``prefixItems``);
    :func:`~synclib.judge.parse.parse_evaluation` reads both.

    When the server refuses ``response_format`` (HTTP 400/422 naming ``response_format``, ``json_schema``,
    ``schema`` or ``grammar``, e.g. llama.cpp for a ``maxLength`` of 2000 or more), the request is re-sent
    without it, and so are all later ones; the refusal is logged once and :attr:`structured_refused` set.
    Cache keys record what was *requested* (:meth:`response_format`), not what the server accepted.
    """

    RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

    def __init__(self, connection: JudgeConnection, sampling: JudgeSampling | None = None, *,
                 sleep: Callable[[float], None] = time.sleep):
        import httpx

        if not isinstance(connection, JudgeConnection):
            raise JudgeError(f"OpenAIBackend needs a JudgeConnection, got {connection!r}")
        if connection.url is None:
            raise JudgeError("JudgeConnection.url must be an http(s) URL for an HTTP judge "
                             "(--judge-url), got None")
        sampling = JudgeSampling() if sampling is None else sampling
        if not isinstance(sampling, JudgeSampling):
            raise JudgeError(f"OpenAIBackend needs a JudgeSampling, got {sampling!r}")
        self.connection = c = connection
        self.sampling = s = sampling
        self.url = c.url.rstrip("/") + "/chat/completions"
        self.model, self.api_key_env = c.model, c.api_key_env
        self.max_retries, self.backoff, self.max_backoff = c.max_retries, c.backoff, c.max_backoff
        self.temperature, self.seed, self.max_tokens = s.temperature, s.seed, s.max_tokens
        self.structured, self.reasoning_max_chars = s.structured, s.reasoning_max_chars
        self._sleep = sleep
        api_key_env, max_tokens, reasoning_max_chars = c.api_key_env, s.max_tokens, s.reasoning_max_chars
        self._response_format = {
            "type": "json_schema",
            "json_schema": {"name": RESPONSE_FORMAT_NAME,
                            "schema": structured_schema(reasoning_max_chars), "strict": True},
        }
        self.structured_refused = False
        if (self.structured and max_tokens is not None
                and max_tokens < (budget := structured_token_budget(reasoning_max_chars))):
            log.warning("max_tokens=%d is below the %d tokens the longest structured evaluation "
                        "(reasoning_max_chars=%d) may need: a long answer can be cut short; "
                        "leave max_tokens unset or lower reasoning_max_chars",
                        max_tokens, budget, reasoning_max_chars)
        key = os.environ.get(api_key_env) or ""
        if not key:
            log.warning("environment variable %s is not set: sending requests without an "
                        "API key", api_key_env)
        self._secret = key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(timeout=httpx.Timeout(connection.timeout), headers=headers)
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
        return self.sampling.settings

    def redact(self, text: str) -> str:
        """``text`` with the API key replaced by ``***``."""
        return text.replace(self._secret, "***") if self._secret else text

    def close(self) -> None:
        self._client.close()

    def response_format(self, structured: bool | None = None) -> dict | None:
        """A fresh copy of the ``json_schema`` format when structured output is requested (``structured``, or
        this backend's setting when None), else None, whether or not the server refused it."""
        use = self.structured if structured is None else bool(structured)
        if not use:
            return None
        return copy.deepcopy(self._response_format)

    def complete(self, messages: list[dict], structured: bool | None = None) -> str:
        """The assistant's answer to ``messages``; ``structured`` None: this backend's setting (not sent once
        refused).  Raises :class:`JudgeRequestError`, redacted, when the request failed for good."""
        body: dict = {"model": self.model, "messages": messages,
                      "temperature": self.temperature, "seed": self.seed}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        fmt = self.response_format(structured)
        if fmt is not None and not self.structured_refused:
            try:
                return self._post(dict(body, response_format=fmt), refusable=True)
            except _StructuredRefused as e:
                self._note_refusal(str(e))
        return self._post(body)

    def _note_refusal(self, reason: str) -> None:
        """Remember that the server refused ``response_format``; log it once."""
        with self._count_lock:
            first, self.structured_refused = not self.structured_refused, True
        if first:
            log.warning("%s refused structured output (response_format json_schema): %s; "
                        "falling back to plain JSON mode for the rest of this run",
                        self.url, self.redact(reason))

    def _post(self, body: dict, refusable: bool = False) -> str:
        """POST ``body`` with retries; the answer's content.  With ``refusable``, a refusal of the response format
        raises :class:`_StructuredRefused`."""
        import httpx

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
                if (refusable and r.status_code in _REFUSAL_STATUS
                        and _REFUSAL_TEXT.search(r.text)):
                    raise _StructuredRefused(last)
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
        From :func:`synclib.models.load_model`.
    max_new_tokens : int
        Limit of a JSON-mode answer.
    batch_size : int
        Rows per forward pass in constrained scoring (the engine's batch size).
    seed : int
        Torch seed set before every generation (decoding is greedy).
    """

    def __init__(self, loaded: Any, max_new_tokens: int = LOCAL_MAX_NEW_TOKENS,
                 batch_size: int = JudgeOptions.batch_size, seed: int = JudgeSampling.seed):
        self.loaded = loaded
        self.max_new_tokens, self.batch_size, self.seed = max_new_tokens, batch_size, seed
        self.engine = Engine(loaded, max_rows=batch_size)
        self.requests_sent = 0

    @property
    def judge_id(self) -> str:
        return str(getattr(self.loaded, "name", "local"))

    @property
    def settings(self) -> dict:
        return {"temperature": 0.0, "seed": self.seed, "max_tokens": self.max_new_tokens}

    def redact(self, text: str) -> str:
        return text

    def response_format(self, structured: bool | None = None) -> None:
        """None: a local judge has no structured output (constrained mode is its way to valid scores), so
        ``structured`` changes neither its requests nor their cache keys."""
        return None

    def close(self) -> None:
        self.engine.clear()

    def _render(self, messages: list[dict]) -> str:
        if len(messages) == 2 and messages[0]["role"] == "system":
            return self.loaded.chat_prompt(messages[1]["content"], system=messages[0]["content"])
        tok = self.loaded.tokenizer
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        text = "\n\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages[1:])
        return self.loaded.chat_prompt(text, system=messages[0]["content"])

    def complete(self, messages: list[dict], structured: bool | None = None) -> str:
        """Greedy generation of the answer to ``messages`` (``structured`` is ignored)."""
        import torch

        self.requests_sent += 1
        inp = torch.tensor([self.loaded.encode(self._render(messages))], device=self.loaded.device)
        torch.manual_seed(self.seed)
        with torch.no_grad():
            out = self.loaded.model.generate(
                input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=False,
                max_new_tokens=self.max_new_tokens, pad_token_id=self.loaded.pad_token_id,
                eos_token_id=sorted(self.loaded.stop_token_ids) or None)
        return self.loaded.tokenizer.decode(out[0, inp.shape[1]:], skip_special_tokens=True)

    def score(self, prompts: list[str], candidates: list[list[str]]) -> list[np.ndarray]:
        """Log-probabilities of complete candidate answers (see :func:`score_candidates`)."""
        self.requests_sent += 1
        return score_candidates(self.engine, prompts, candidates)


def _terminator_id(tokenizer) -> int:
    """The token that ends an assistant turn: the first after a rendered assistant message in the chat
    template (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``...), else eos, else a newline."""
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


def _candidate_ids(lm, prompt_ids: list[int], prompt: str, cand: str) -> list[int]:
    """Token ids of ``cand`` as tokenized right after ``prompt``; alone when the joint text splits differently."""
    joint = list(lm.encode(prompt + cand))
    if joint[: len(prompt_ids)] == prompt_ids and len(joint) > len(prompt_ids):
        return joint[len(prompt_ids):]
    return list(lm.tokenizer(cand, add_special_tokens=False).input_ids)


def score_candidates(engine: Engine, prompts: Sequence[str], candidates: Sequence[Sequence[str]],
                     terminator: int | None = None) -> list[np.ndarray]:
    """Full-sequence log-probability of each candidate answer after each prompt.

    Scores such as "10" or "-5" are several tokens, so each candidate is scored as ``log P(candidate tokens +
    terminator | prompt)``, the terminator being the chat template's end-of-turn token: "1" and "10" are then
    disjoint events, and normalising over the candidates gives the judge's distribution over valid answers.

    Scoring is :meth:`synclib.engine.Engine.sequence_logprobs` (prefill only, teacher-forced).  The longest
    token prefix shared by all ``prompts`` (the 14 questions of one episode) is prefilled once into an engine
    session every prompt re-uses; left padding keeps this valid under sliding-window attention (Gemma-3).

    Parameters
    ----------
    engine : synclib.engine.Engine
        Over the judge model (``engine.lm``, a ``LoadedModel``).
    prompts : sequence of P str
        Complete model inputs (chat template applied), ending where the answer starts.
    candidates : sequence of P sequences of str
        The allowed answers of each prompt.
    terminator : int, optional
        Token id ending an answer; default :func:`_terminator_id`.

    Returns
    -------
    list of P float64 arrays
        ``out[p][c]`` = log-probability of ``candidates[p][c]`` (unnormalised over candidates).
    """
    if len(prompts) != len(candidates):
        raise JudgeError("score_candidates: prompts and candidates differ in length")
    if not prompts:
        return []
    lm = engine.lm
    term = _terminator_id(lm.tokenizer) if terminator is None else int(terminator)
    pids = [list(lm.encode(p)) for p in prompts]
    if min(map(len, pids)) == 0:
        raise JudgeError("score_candidates: empty prompt")
    answers = [[_candidate_ids(lm, ids, prompt, c) + [term] for c in cands]
               for prompt, ids, cands in zip(prompts, pids, candidates)]
    shared = len(os.path.commonprefix(pids))  # longest common prefix of the token-id lists
    try:
        if shared > 0 and len(pids) > 1:
            engine.read_states([pids[0][:shared]], sessions=[_PREFIX_SESSION])
        return engine.sequence_logprobs(pids, answers, sessions=[_PREFIX_SESSION] * len(pids))
    finally:
        engine.forget(_PREFIX_SESSION)
