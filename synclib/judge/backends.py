"""Judge backends: an OpenAI-compatible HTTP endpoint and a local model.

:class:`OpenAIBackend` (any OpenAI-compatible ``/chat/completions`` endpoint: vLLM,
llama.cpp server, hosted APIs; bounded concurrency, timeouts, retries with
exponential backoff) and :class:`LocalBackend` (a ``synclib.models.LoadedModel``).
Both use temperature 0 and a fixed seed.  Only a local backend can ``score``
(constrained mode): :func:`score_candidates` on :class:`synclib.engine.Engine`.

The API key is read from an environment variable at call time and kept only in the
HTTP client's headers: it is never written to a file, log, table or error message
(error texts are redacted).

Structured output: by default :class:`OpenAIBackend` asks the server to hold its answer
to the evaluation's JSON schema (OpenAI's ``response_format`` of type ``json_schema``,
which vLLM and llama.cpp's ``llama-server`` enforce with a grammar), and falls back
to plain JSON mode, for the rest of the run, when the server refuses it.
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

#: What a server's refusal of ``response_format`` says (HTTP 400/422): llama.cpp's "JSON
#: schema conversion failed" / "failed to parse grammar", vLLM's "JSON schema ... not
#: supported", a validation error naming ``response_format``...
_REFUSAL_STATUS = frozenset({400, 422})
_REFUSAL_TEXT = re.compile(r"response_format|json_schema|schema|grammar", re.IGNORECASE)


class _StructuredRefused(Exception):
    """The server refused the request's ``response_format`` (internal to the backend)."""


class OpenAIBackend:
    """An OpenAI-compatible chat-completions endpoint.

    Parameters
    ----------
    connection : JudgeConnection
        The endpoint (``connection.url``, the API root, e.g. ``http://localhost:8000/v1``;
        requests go to ``{url}/chat/completions``), the served model (also the judge id
        in tables and cache keys), the environment variable holding the API key (read
        now; when unset or empty no ``Authorization`` header is sent, as a local vLLM
        needs none), timeout, retries and backoff
        (:class:`~synclib.judge.options.JudgeConnection`).
    sampling : JudgeSampling, optional
        Sent with every request (:class:`~synclib.judge.options.JudgeSampling`; default
        its defaults): ``temperature``, ``seed`` and ``max_tokens``
        (``max_tokens=None`` sends none: the server's own limit applies, and a server
        enforcing the schema stops where the schema ends; under structured output a
        ``max_tokens`` below :func:`synclib.judge.rubric.structured_token_budget` is
        warned about, since it can cut a valid answer short); ``structured`` and
        ``reasoning_max_chars`` as below.
    sleep : callable
        Waits between retries (``time.sleep``; tests pass a stand-in).

    ``sampling.structured`` asks for structured output (default): every request carries
    ``response_format = {"type": "json_schema", "json_schema": {"name":
    "sotopia_evaluation", "schema": ..., "strict": true}}`` with the schema of
    :func:`synclib.judge.rubric.structured_schema`: one **object** ``{"reasoning",
    "score"}`` per dimension, the reasoning at most ``sampling.reasoning_max_chars``
    characters (1 to 1999), the score an integer within the dimension's range.  Servers
    that enforce it (vLLM, llama.cpp) can then only answer with a complete, valid
    evaluation.  False: plain JSON mode (the instructions alone ask for JSON), as before.
    Retries: after the first attempt, ``connection.max_retries`` more on 429, 5xx,
    timeouts and dropped connections, waiting ``min(backoff * 2**attempt,
    max_backoff)`` seconds (a 429's ``Retry-After`` honoured up to ``max_backoff``);
    other errors are not retried.

    Notes
    -----
    *Structured output and the instructions.*  The instructions in the prompt are sent
    unchanged.  The paper's (``judge_instructions.txt``, the ``reference`` layout)
    describe Sotopia's schema, in which each dimension is a ``[reasoning, score]``
    tuple; with structured output the server forces the object form instead.  That is
    intended: :func:`synclib.judge.parse.parse_evaluation` reads both forms into the
    same (reasoning, score) pairs, and the tuple form cannot be sent as a schema
    (llama.cpp refuses ``prefixItems``).

    *Refusal.*  When a request with ``response_format`` gets HTTP 400 or 422 whose text
    mentions ``response_format``, ``json_schema``, ``schema`` or ``grammar``, the same
    request is sent once more without it (plain JSON mode), and the refusal is
    remembered: later requests of this backend (the rest of the run) go without it.
    The refusal is logged once (a warning).  :attr:`structured_refused` tells whether
    it happened.  (llama.cpp refuses schemas it cannot turn into a grammar, e.g.
    Sotopia's tuples or a ``maxLength`` of 2000 or more; a hosted API whose strict
    mode lacks a keyword used here may refuse too: both end in plain JSON mode.)  Cache keys (:mod:`synclib.judge.evaluate`) record what was
    *requested* (:meth:`response_format`), not whether the server accepted it.
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
        """The ``response_format`` a request asks for: a fresh copy of the
        ``json_schema`` format when structured output is requested (``structured``, or
        this backend's setting when None), else None.  Whether the server refused it
        does not matter here (see :meth:`complete`)."""
        use = self.structured if structured is None else bool(structured)
        if not use:
            return None
        return copy.deepcopy(self._response_format)

    def complete(self, messages: list[dict], structured: bool | None = None) -> str:
        """The assistant's answer to ``messages`` (retrying as documented).

        Parameters
        ----------
        messages : list of dict
        structured : bool, optional
            Ask for structured output; None: this backend's ``structured`` setting.
            Not sent once the server has refused it (the answer then comes from one
            more request without it; see the class notes).

        Raises
        ------
        JudgeRequestError
            With a redacted reason, when the request failed for good.
        """
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
        """POST ``body``, retrying as documented; the answer's content.

        With ``refusable``, an HTTP 400/422 about the response format raises
        :class:`_StructuredRefused` instead of :class:`JudgeRequestError`.
        """
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
        Torch seed set before every generation (greedy decoding, so only for
        completeness).
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
        """None: a local judge generates freely (no structured output; its answers are
        parsed as JSON as they come, and constrained mode is the local way to valid
        scores), so ``structured`` changes neither its requests nor their cache keys."""
        return None

    def close(self) -> None:
        self.engine.clear()

    def _render(self, messages: list[dict]) -> str:
        if len(messages) == 2 and messages[0]["role"] == "system":
            return self.loaded.chat_prompt(messages[1]["content"], system=messages[0]["content"])
        tok = self.loaded.tokenizer
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # no template: fold the conversation into one user message
        text = "\n\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages[1:])
        return self.loaded.chat_prompt(text, system=messages[0]["content"])

    def complete(self, messages: list[dict], structured: bool | None = None) -> str:
        """Greedy free generation of the answer to ``messages`` (``structured`` is
        ignored: see :meth:`response_format`)."""
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


def _candidate_ids(lm, prompt_ids: list[int], prompt: str, cand: str) -> list[int]:
    """Token ids of ``cand`` as ``lm`` tokenizes it right after ``prompt`` (whose ids are
    ``prompt_ids``); the candidate alone when the joint text splits differently."""
    joint = list(lm.encode(prompt + cand))
    if joint[: len(prompt_ids)] == prompt_ids and len(joint) > len(prompt_ids):
        return joint[len(prompt_ids):]
    return list(lm.tokenizer(cand, add_special_tokens=False).input_ids)


def score_candidates(engine: Engine, prompts: Sequence[str], candidates: Sequence[Sequence[str]],
                     terminator: int | None = None) -> list[np.ndarray]:
    """Full-sequence log-probability of each candidate answer after each prompt.

    Why full sequences: the allowed scores include multi-token strings ("10", "-5",
    "-10" are two or three tokens in most vocabularies), so the next-token distribution
    alone cannot tell "1" from "10".  Each candidate is scored as ``log P(candidate
    tokens + terminator | prompt)`` where the terminator is the end-of-turn token of the
    chat template (:func:`_terminator_id`): a complete answer, so that "1" and "10" are
    disjoint events and every allowed integer gets a proper score.  Normalising over the
    candidates gives the judge's distribution restricted to valid answers.

    The scoring is the engine's (:meth:`synclib.engine.Engine.sequence_logprobs`:
    prefill only, no generation, ``engine.batch_size`` rows per pass, the candidates'
    later tokens teacher-forced over each prompt's keys/values).  The longest token
    prefix shared by all ``prompts`` (intro, dialog and rubric when they are the 14
    questions of one episode) is prefilled once, into an engine session that every
    prompt then re-uses, so each prompt computes only its own last tokens.  The
    engine pads on the left only, so this holds under sliding-window attention
    (Gemma-3) too.

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
        ``out[p][c]`` = log-probability of ``candidates[p][c]`` (unnormalised over
        candidates).
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
