"""Judge backends: an OpenAI-compatible HTTP endpoint and a local model.

:class:`OpenAIBackend` (any OpenAI-compatible ``/chat/completions`` endpoint: vLLM,
llama.cpp server, hosted APIs; bounded concurrency, timeouts, retries with
exponential backoff) and :class:`LocalBackend` (a ``synclib.models.LoadedModel``).
Both use temperature 0 and a fixed seed.  Only a local backend can ``score``
(constrained mode): :func:`score_candidates` on :class:`synclib.engine.Engine`.

The API key is read from an environment variable at call time and kept only in the
HTTP client's headers: it is never written to a file, log, table or error message
(error texts are redacted).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from synclib.engine import Engine
from synclib.judge.errors import JudgeError, JudgeRequestError

__all__ = ["OpenAIBackend", "LocalBackend", "score_candidates"]

log = logging.getLogger(__name__)

#: the engine session holding the prompts' shared prefix during :func:`score_candidates`
_PREFIX_SESSION = ("synclib.judge", "shared prompt prefix")


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
        From :func:`synclib.models.load_model`.
    max_new_tokens : int
        Limit of a JSON-mode answer.
    batch_size : int
        Rows per forward pass in constrained scoring (the engine's batch size).
    seed : int
        Torch seed set before every generation (greedy decoding, so only for
        completeness).
    """

    def __init__(self, loaded: Any, max_new_tokens: int = 1024, batch_size: int = 16,
                 seed: int = 0):
        self.loaded = loaded
        self.max_new_tokens, self.batch_size, self.seed = max_new_tokens, batch_size, seed
        self.engine = Engine(loaded, batch_size=batch_size)
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

    def complete(self, messages: list[dict]) -> str:
        """Greedy free generation of the answer to ``messages``."""
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
