"""Judging: every dialog in, 14 table rows out, never stopping on a failure.

Two modes (the ``mode`` column)
-------------------------------
``json``
    The judge writes the whole evaluation as JSON (the paper's way), validated field by field
    (:mod:`synclib.judge.parse`); it is asked **once** to repair a failing answer, and what still fails is
    recorded as missing with the reason and the raw text.  An HTTP judge asks for structured output by
    default (:class:`~synclib.judge.backends.OpenAIBackend`); ``JudgeSampling(structured=False)``
    (``--no-structured``) for plain JSON mode.
``constrained``
    For small local judges: one question per agent and dimension, the score read from the judge's
    distribution over the allowed integers (:func:`~synclib.judge.backends.score_candidates`); ``score`` is
    the most probable integer, ``expected`` the probability-weighted mean.

Every answer is cached (:class:`~synclib.judge.cache.JudgeCache`), a JSON-mode one under :func:`request_key`.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import netCDF4
import numpy as np
import pandas as pd
from tqdm import tqdm

from synclib.judge.backends import LocalBackend, OpenAIBackend
from synclib.judge.cache import JudgeCache, cache_key
from synclib.judge.episodes import read_episodes
from synclib.judge.errors import JudgeError, JudgeRequestError
from synclib.judge.items import JudgeItem, items_from_cube, sample_items
from synclib.judge.options import LOCAL_MAX_NEW_TOKENS, MODES, JudgeOptions
from synclib.judge.parse import parse_evaluation
from synclib.judge.prompt import (SYSTEM_MESSAGE, constrained_question, judge_messages,
                                  load_instructions, repair_messages)
from synclib.judge.rubric import EMBEDDED_INSTRUCTIONS, FIELDS, SCORE_RANGES
from synclib.judge.table import make_row, make_table, save_table, social_performance
from synclib.models import load_model
from synclib.tasks.scenarios import load_tasks

__all__ = ["MODES", "judge_items", "judge_item_json", "judge_item_constrained", "evaluate_cube",
           "evaluate_episodes", "judge_to_file", "request_key"]

log = logging.getLogger(__name__)


def _failed(item: JudgeItem, judge: str, mode: str, error: str) -> list[dict]:
    """The 14 rows of an item that got no scores, each with ``error``."""
    return [make_row(item, a, d, judge, mode, error=error) for a, d in FIELDS]


def request_key(backend, messages: list[dict], structured: bool | None = None) -> str:
    """The cache key of a JSON-mode request: judge id, sampling settings, messages and, when structured output
    is requested, the requested ``response_format`` (also when the server refused it)."""
    request: dict = {"settings": backend.settings, "messages": messages}
    fmt = backend.response_format(structured) if hasattr(backend, "response_format") else None
    if fmt is not None:
        request["response_format"] = fmt
    return cache_key(backend.judge_id, request)


def _cached_complete(backend, cache: JudgeCache, messages: list[dict],
                     structured: bool | None = None) -> str:
    key = request_key(backend, messages, structured)
    hit = cache.get(key)
    if hit is not None:
        return hit
    text = (backend.complete(messages) if structured is None
            else backend.complete(messages, structured=structured))
    cache.put(key, backend.judge_id, text)
    return text


def judge_item_json(item: JudgeItem, backend, cache: JudgeCache, instructions: str,
                    structured: bool | None = None) -> list[dict]:
    """The 14 rows of one dialog judged in JSON mode (one repair at most)."""
    judge = backend.judge_id
    if item.empty:
        return _failed(item, judge, "json", "episode has no utterances")
    messages = judge_messages(item, instructions)
    try:
        raw = _cached_complete(backend, cache, messages, structured)
    except JudgeRequestError as e:
        return _failed(item, judge, "json", backend.redact(f"request failed: {e}"))
    valid, errors = parse_evaluation(raw)
    raw_all = raw
    if errors:
        try:
            raw2 = _cached_complete(backend, cache, repair_messages(messages, raw, errors),
                                    structured)
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
    for a, d in FIELDS:
        if (a, d) in valid:
            reasoning, s = valid[(a, d)]
            rows.append(make_row(item, a, d, judge, "json", score=s,
                                 reasoning=backend.redact(reasoning)))
        else:
            rows.append(make_row(item, a, d, judge, "json", error=errors[(a, d)],
                                 raw=backend.redact(raw_all)))
    return rows


def judge_item_constrained(item: JudgeItem, backend: LocalBackend, cache: JudgeCache) -> list[dict]:
    """The 14 rows of one dialog judged in constrained mode."""
    judge = backend.judge_id
    if item.empty:
        return _failed(item, judge, "constrained", "episode has no utterances")
    prompts, cands, ckeys = [], [], []
    for a, d in FIELDS:
        lo, hi = SCORE_RANGES[d]
        prompts.append(backend.loaded.chat_prompt(constrained_question(item, a, d),
                                                  system=SYSTEM_MESSAGE))
        cands.append([str(v) for v in range(lo, hi + 1)])
        ckeys.append(cache_key(judge, {"mode": "constrained", "prompt": prompts[-1],
                                       "candidates": cands[-1]}))
    # all 14 or none: a resumed item is batched as in an uninterrupted run, so its scores are bitwise the same
    todo = list(range(len(ckeys))) if any(k not in cache for k in ckeys) else []
    try:
        if todo:
            scored = backend.score([prompts[i] for i in todo], [cands[i] for i in todo])
            for i, lp in zip(todo, scored):
                cache.put(ckeys[i], judge, [float(x) for x in lp])
    except Exception as e:  # never stop the batch
        log.exception("constrained scoring failed for episode %s seed %s", item.episode,
                      item.sim_seed)
        return _failed(item, judge, "constrained", f"scoring failed: {type(e).__name__}: {e}")
    rows = []
    for (a, d), c, k in zip(FIELDS, cands, ckeys):
        lp = np.asarray(cache.get(k), dtype=float)
        values = np.array([int(v) for v in c])
        p = np.exp(lp - lp.max())
        p /= p.sum()
        rows.append(make_row(item, a, d, judge, "constrained", score=int(values[int(np.argmax(lp))]),
                             expected=float(p @ values)))
    return rows


def judge_items(items: Sequence[JudgeItem], backend, mode: str = "json",
                cache: JudgeCache | None = None, instructions: str = EMBEDDED_INSTRUCTIONS,
                concurrency: int = 8, progress: bool = True,
                structured: bool | None = None) -> pd.DataFrame:
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
        Items in flight at once (threads) for an HTTP backend; local backends run one at a time.
    progress : bool
        Show a tqdm bar on stderr.
    structured : bool, optional
        JSON mode with an HTTP judge: ask for structured output; None: the backend's setting.

    Returns
    -------
    pandas.DataFrame
        14 rows per item, :data:`~synclib.judge.table.TABLE_COLUMNS`, sorted by episode, seed, agent, dimension.
    """
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
                return judge_item_json(item, backend, cache, instructions, structured)
            return judge_item_constrained(item, backend, cache)
        except Exception as e:  # a bug or an unforeseen failure: record, go on
            log.exception("judging episode %s seed %s failed", item.episode, item.sim_seed)
            return _failed(item, backend.judge_id, mode, backend.redact(f"{type(e).__name__}: {e}"))

    rows: list[dict] = []
    bar = tqdm(total=len(items), desc=f"judging ({mode})", unit="episode", disable=None if progress else True)
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
    return make_table(rows)


def evaluate_cube(cube: str | os.PathLike, options: JudgeOptions, *,
                  out: str | os.PathLike | None = None, cache: str | os.PathLike | None = None,
                  progress: bool = True, log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """``synclib evaluate CUBE``: judge every dialog of a cube, write and return the table (:func:`judge_to_file`).
    ``options.scenarios`` is the cube's task set (its judge instructions used when it ships them);
    ``options.layout`` one of :data:`synclib.judge.items.LAYOUTS`."""
    _check_options(options)
    cube = Path(cube)
    if not cube.is_file():
        raise JudgeError(f"cube {cube} does not exist")
    try:
        with netCDF4.Dataset(cube, "r"):
            pass
    except OSError as exc:
        raise JudgeError(f"{cube} is not a finished cube: it cannot be read as netCDF ({exc}); a truncated "
                         "or foreign file? Re-run the simulation that writes it") from None
    tasks = load_tasks(options.scenarios)
    items = items_from_cube(cube, tasks, layout=options.layout)
    return judge_to_file(items, cube, options, out=out, cache=cache, progress=progress, log=log)


def evaluate_episodes(path: str | os.PathLike, options: JudgeOptions, *,
                      out: str | os.PathLike | None = None, cache: str | os.PathLike | None = None,
                      progress: bool = True, log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """``synclib evaluate EPISODES.jsonl``: judge the episodes of a file (:mod:`synclib.judge.episodes`), write
    and return the table, with ``episode_id`` beside ``episode`` (the line's position).  ``options.scenarios``
    only chooses the judge instructions (``sotopia`` for the paper's); ``options.layout`` is not used."""
    _check_options(options)
    items = read_episodes(path)
    return judge_to_file(items, Path(path), options, out=out, cache=cache, progress=progress, log=log)


def _check_options(options: JudgeOptions) -> None:
    if not isinstance(options, JudgeOptions):
        raise JudgeError(f"options must be a JudgeOptions (JudgeOptions.from_config builds one from a "
                         f"run config), got {type(options).__name__}")


def _backend(options: JudgeOptions):
    """The backend ``options`` name: HTTP with a URL, else the local judge model."""
    conn, sampling = options.connection, options.sampling
    if not conn.local:
        return OpenAIBackend(conn, sampling)
    return LocalBackend(load_model(conn.model, device=options.device),
                        max_new_tokens=sampling.max_tokens or LOCAL_MAX_NEW_TOKENS,
                        batch_size=options.batch_size, seed=sampling.seed)


def judge_to_file(items: list[JudgeItem], source: Path, options: JudgeOptions, *,
                  out: str | os.PathLike | None = None, cache: str | os.PathLike | None = None,
                  progress: bool = True, log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Judge ``items`` as ``options`` say (judge, sampling, mode, a sample of ``options.sample`` dialogs), write
    the table to ``out`` (default ``SOURCE.judge.csv``) and return it.  Answers are cached in ``cache`` (default
    ``SOURCE.judge-cache.jsonl``), so a second call asks nothing again; ``log`` gets the two summary lines
    (default: stderr)."""
    _check_options(options)
    log = log or (lambda msg: print(msg, file=sys.stderr))
    mode, http, sampling = options.judge_mode, not options.connection.local, options.sampling
    instructions, instr_source = load_instructions(options.scenarios)
    n_dialogs = len(items)
    items = sample_items(items, options.sample, options.sample_seed)
    backend: Any = _backend(options)
    out = Path(out) if out else source.with_suffix(".judge.csv")
    cache_ = JudgeCache(cache if cache else source.with_suffix(".judge-cache.jsonl"))
    what = f"instructions: {instr_source}" if mode == "json" else "one question per agent and dimension"
    if mode == "json" and http:
        what += ("; structured output, reasoning at most "
                 f"{sampling.reasoning_max_chars} characters" if sampling.structured
                 else "; no structured output")
    log(f"judging {len(items)} {'of ' + str(n_dialogs) + ' ' if len(items) < n_dialogs else ''}dialogs with {backend.judge_id} ({mode} mode, {what}); "
        f"cache {cache_.path} holds {len(cache_)} answers")
    try:
        table = judge_items(items, backend, mode=mode, cache=cache_, instructions=instructions,
                            concurrency=options.concurrency, progress=progress)
    finally:
        backend.close()
    if any(it.episode_id for it in items):
        ids = {it.episode: it.episode_id for it in items}
        table.insert(1, "episode_id", table["episode"].map(ids))
    save_table(table, out)
    missing = int(table["score"].isna().sum())
    refused = ("; the server refused structured output (plain JSON mode was used)"
               if getattr(backend, "structured_refused", False) else "")
    log(f"wrote {out}: {len(table) - missing} scores, {missing} missing; "
        f"social performance {social_performance(table):.3f}; {backend.requests_sent} judge calls"
        f"{refused}")
    return table
