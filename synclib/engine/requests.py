"""What a caller asks the engine for and gets back: rows (:class:`Request`), their seeds (:func:`row_seed`,
:func:`uniforms`) and results (:class:`Result`, :func:`make_result`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

__all__ = ["DECODE_MODES", "FINISH_REASONS", "Request", "Result", "row_seed", "uniforms",
           "make_result", "check_sampling"]

#: how :class:`~synclib.engine.Engine` runs decoding steps (its ``decode`` parameter)
DECODE_MODES = ("auto", "graph", "static", "dynamic")
#: :attr:`Result.finish_reason` by code: 0 length, 1 stop token, 2 first line complete
FINISH_REASONS = ("length", "stop", "line")


def row_seed(*keys: int) -> int:
    """A 63-bit sampling seed from non-negative integer keys, e.g. ``(sim_seed, task_index, utterance_index)``;
    stable across runs, platforms and Python versions (SHA-256 of the keys)."""
    text = ",".join(str(int(k)) for k in keys)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


@dataclass(frozen=True)
class Request:
    """One row to generate.

    Attributes
    ----------
    prompt : str or sequence of int
        Chat-formatted prompt text (:meth:`LoadedModel.chat_prompt`) or its token ids.
    seed : int
        Seed of the row's random generator (see :func:`row_seed`).
    session : hashable, optional
        Key of the KV cache to reuse and update (one per agent and episode); ``None`` means no reuse.
    """

    prompt: object
    seed: int = 0
    session: Hashable | None = None


@dataclass
class Result:
    """What :meth:`Engine.generate` returns for one row.

    Attributes
    ----------
    text : str
        Generated text, special tokens removed, stop token excluded (not post-processed).
    token_ids : list[int]
        Generated token ids (stop token excluded).
    prompt_ids : list[int]
        The prompt's token ids; ``len(prompt_ids)`` is the prompt length.
    states : numpy.ndarray
        ``(n_layers, d_model)`` float32: every decoder layer's output at the last prompt token.
    finish_reason : str
        ``"stop"`` (a stop token was sampled), ``"line"`` (the first line was complete, with ``first_line_only``)
        or ``"length"`` (``max_new_tokens`` reached).
    reused_tokens : int
        Prompt tokens whose keys/values came from the session cache instead of a prefill.
    scores : tuple
        A :class:`~synclib.engine.DecodeStream` row's :class:`~synclib.engine.probes.Probe` read-outs ``(first,
        then)``: float64 log-probabilities per sequence of ``probe.first`` / ``probe.then``, or None where the
        point was not reached (no marked token in time); ``()`` without a probe.
    """

    text: str
    token_ids: list
    prompt_ids: list
    states: np.ndarray
    finish_reason: str
    reused_tokens: int = 0
    scores: tuple = ()

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


def make_result(lm, tokens: list, prompt_ids: list, states: np.ndarray, why: int, reused: int,
                scores: tuple = ()) -> Result:
    """A row's :class:`Result`: its kept ``tokens`` decoded by ``lm``; ``why`` indexes :data:`FINISH_REASONS`."""
    return Result(text=lm.decode(tokens), token_ids=tokens, prompt_ids=prompt_ids, states=states,
                  finish_reason=FINISH_REASONS[why], reused_tokens=reused, scores=scores)


def uniforms(seeds: Sequence[int], n: int):
    """Each row's uniforms for a whole reply: ``(len(seeds), n)`` float64 on the CPU, row ``i`` from a CPU
    ``torch.Generator`` seeded with ``seeds[i]`` (the same numbers as one draw per step)."""
    import torch

    gens = [torch.Generator(device="cpu").manual_seed(int(s) & ((1 << 63) - 1)) for s in seeds]
    return torch.stack([torch.rand(n, generator=g, dtype=torch.float64) for g in gens])


def check_sampling(max_new_tokens, temperature, top_k, top_p) -> None:
    """Refuse sampling settings out of range, naming the parameter."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and int(top_k) < 0:
        raise ValueError(f"top_k must be >= 0 or None, got {top_k}")
    if top_p is not None and not 0 < float(top_p) <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")
