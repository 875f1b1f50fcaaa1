"""The dialog loop: two models play Sotopia tasks and fill an activation cube.

:func:`simulate` runs model A as agent 1 and model B as agent 2 over a set of
tasks and simulation seeds, following ``protocol.md``: agent 1 speaks at even
utterance indices, agent 2 at odd ones, at most ``max_utterances`` (16)
utterances, an episode ends after an utterance for which
:func:`synclib.prompts.is_leave` holds, every reply goes through
:func:`synclib.prompts.postprocess_reply`; sampling at temperature 0.7 with
at most 300 new tokens, from the distribution ``transformers``' ``generate`` samples from
(top-k 50 and the checkpoint's top-p unless set otherwise; :func:`resolve_sampling`).

Batching.  The (episode, seed) *units* are cut, in cube order, into batches of
``batch_size``.  Inside a batch all live episodes advance together: at
utterance ``t`` every live row is agent ``t % 2``'s turn, so one call of
:func:`synclib.engine.generate` on that agent's model serves them all;
finished episodes drop out.  Every row samples with its own generator, seeded
from (sim_seed, task index, utterance, run) (:func:`synclib.engine.row_seed`),
so a dialog does not depend on which other rows share its batch, and each
agent's prompt re-uses the keys/values of its previous prompt (one engine
session per episode, seed and agent).  The hidden states of every decoder layer at
the last prompt token of utterance ``t`` go to round ``t // 2`` of
``hidden_a`` (even ``t``) or ``hidden_b`` (odd ``t``).

Optional passes, run per batch after the genuine dialogs:

* passive (``passive=True``): the genuine dialogs of the ``passive_seeds`` are re-read
  with the passive prompt view, model A in agent 1's slot (``hidden_a_passive``) and
  model B in agent 2's slot (``hidden_b_passive``); prefill only.  The reader is told it
  is the persona drawn for (task, seed) as the paper's code draws it
  (:func:`synclib.prompts.passive_persona`, recorded in ``passive_reader``).
* Theory of Mind (``tom=True``): a separate dialog run with the ToM view
  (emotion/action instruction; the partner's history without those words), for every
  unit or, with ``tom_episodes``, only for the units of the first that many tasks (the
  others keep the cube's "unreached" values: ``n_utterances_tom`` is -1),
  storing ``hidden_*_tom``, ``text_*_tom`` and the distributions over the 8
  emotion and 5 action words where the agent generates them (``emotion_*``,
  ``action_*``).  This module owns the ToM reply format (:func:`_tom_readout`,
  built on :meth:`synclib.engine.Engine.word_distributions`): the emotion word
  at the reply's first position, the action word after the first generated
  token holding a ``.`` (NaN when none came within 16 tokens).
  ``tom_format_*`` (an addition) is 1 where the raw reply opened with an
  emotion word and then an action word, as instructed, else 0.

With ``scheduling="continuous"`` (continuous batching) the genuine and the ToM dialogs of a
batch share one stream of decoding rows per model (more rows in flight), and the passive
reader reads afterwards; every row's request, seed and session are the same, so the cube is
the same up to float rounding.

Crash safety and resume: every finished batch is written as one part of the
cube (:class:`synclib.cube.CubeWriter`); a re-run of the same command skips
finished batches and re-runs the rest with the same composition, so the
resumed cube equals an uninterrupted one.
"""
from __future__ import annotations

import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from synclib import __version__
from synclib.cube import STORE_DTYPES, CubeSpec, CubeWriter, Unit, is_complete, var_name
from synclib.engine import SCHEDULING
from synclib.memory import CacheBudget, release_free_memory, session_budget
from synclib.prompts import (
    ACTIONS, EMOTIONS, PASSIVE_PERSONA_RULE, REPLY_ENDS, is_leave, passive_persona, postprocess_reply, render_prompt,
    trim_to_sentence,
)
from synclib.scenarios import Task, TaskSet

__all__ = ["simulate", "episode_coords", "default_batch_size", "resolve_sampling"]

# run kinds, mixed into the per-row seeds
_GENUINE, _TOM = 0, 1

#: a ToM reply in the instructed format opens with an emotion word, then an action word
_TOM_FORMAT = re.compile(r"^\W*(?:" + "|".join(EMOTIONS) + r")\W+(?:" + "|".join(ACTIONS) + r")\b", re.I)
#: generated tokens searched for the "." that ends a ToM reply's emotion word
_TOM_SEARCH_TOKENS = 16


def _tom_readout(eng, requests: Sequence, results: Sequence, store: bool = True
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read the ToM replies: emotion and action distributions, and whether each followed the format.

    The ToM instruction asks for ``Emotion. Action type. Response.``  The emotion
    distribution is read at the first generated position (the prompt's next token); the
    action distribution at the position after the first generated token containing ``.``
    (searched among the first :data:`_TOM_SEARCH_TOKENS` generated tokens), i.e. after
    ``"Joy."``: the leading-space spelling of each action word covers ``" Assertive"``.
    Both are :meth:`synclib.engine.Engine.word_distributions` over :data:`EMOTIONS` /
    :data:`ACTIONS` on the exact prompt and generated token ids, with the requests'
    sessions, so only a token or two is prefilled per row.

    Parameters
    ----------
    eng : synclib.engine.Engine
        The engine that generated ``results`` (its sessions are re-used).
    requests, results : sequences of R ``Request`` / ``Result``
        What was passed to and returned by ``eng.generate``.
    store : bool, default True
        Store the read-outs' prompts in the sessions; the continuous loop reads older
        replies after a session has moved on and passes False, so that the newer prompt
        stays cached.

    Returns
    -------
    emotion : numpy.ndarray
        ``(R, len(EMOTIONS))`` float64, rows summing to 1.
    action : numpy.ndarray
        ``(R, len(ACTIONS))`` float64; NaN rows where no ``.`` was generated in time.
    formatted : numpy.ndarray
        ``(R,)`` int: 1 where the raw reply opens with an emotion word and then an action
        word (:data:`_TOM_FORMAT`), else 0.
    """
    if len(requests) != len(results):
        raise ValueError(f"{len(requests)} requests but {len(results)} results")
    sessions = [r.session for r in requests]
    emotion = eng.word_distributions([r.prompt_ids for r in results], EMOTIONS, sessions, store=store)
    action = np.full((len(results), len(ACTIONS)), np.nan)
    prefixes, where, sess = [], [], []
    for i, (req, res) in enumerate(zip(requests, results)):
        for k, t in enumerate(res.token_ids[:_TOM_SEARCH_TOKENS]):
            if "." in eng.lm.tokenizer.decode([t]):
                prefixes.append(list(res.prompt_ids) + list(res.token_ids[:k + 1]))
                where.append(i)
                sess.append(req.session)
                break
    if prefixes:
        action[where] = eng.word_distributions(prefixes, ACTIONS, sess, store=store)
    formatted = np.array([int(bool(_TOM_FORMAT.match(r.text))) for r in results], dtype=int)
    return emotion, action, formatted


def episode_coords(task: Task) -> dict:
    """The cube's episode coordinates of one task."""
    a, b = task.agents
    return dict(task_index=int(task.index), env_id=task.env.pk, codename=task.codename,
                source=task.source, relationship=int(task.relationship),
                agent1_id=a.pk, agent2_id=b.pk, agent1_name=a.name, agent2_name=b.name)


# --------------------------------------------------------------------------- progress

class _Progress:
    """The simulation's progress in utterances: generated (genuine and ToM dialogs) and read
    (the passive reader) of those planned.  The plan is every dialog's ``max_utterances``,
    an upper bound that shrinks as dialogs end early, so the bar's total and time left
    converge on the truth.  A tqdm bar on stderr, shown on terminals only (``disable=None``):
    a log gets the job's own start and end lines instead of redrawn bars.

    Parameters
    ----------
    total : int
        Utterances planned.
    done : int
        Of which already done (a resumed run's finished batches).
    desc : str
    show : bool
    """

    def __init__(self, total: int, done: int, desc: str, show: bool):
        self.new_tokens = 0
        self.started = time.perf_counter()
        self.shown = 0.0
        self.bar = None
        if show:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, unit="utt", desc=desc, file=sys.stderr,
                            dynamic_ncols=True, disable=None, smoothing=0.1)

    def advance(self, n: int) -> None:
        """``n`` utterances generated or read."""
        if self.bar is not None:
            self.bar.update(n)
            self._postfix()

    def drop(self, n: int) -> None:
        """``n`` planned utterances that will not happen (a dialog ended early)."""
        if self.bar is not None and n:
            self.bar.total -= n
            self.bar.refresh()

    def tokens(self, n: int) -> None:
        """``n`` new tokens sampled (redraws at most twice a second)."""
        self.new_tokens += n
        if self.bar is not None and time.perf_counter() - self.shown > 0.5:
            self._postfix()

    def _postfix(self) -> None:
        self.shown = time.perf_counter()
        rate = self.new_tokens / max(self.shown - self.started, 1e-9)
        self.bar.set_postfix_str(f"{rate:.0f} tok/s", refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --------------------------------------------------------------------------- the loop

@dataclass(eq=False)
class _Dialog:
    """One dialog of the continuous loop: a unit (episode, seed) in one view, its utterances
    so far, the utterance it is at and the request in flight.  ``status``: ``"speaking"``
    (a request in flight), ``"reading"`` (ended; ToM read-outs of its replies pending),
    ``"done"`` (its sessions forgotten)."""

    unit: tuple
    value: Unit
    view: str
    history: list = field(default_factory=list)
    turn: int = 0
    asked: object = None
    status: str = "speaking"


class _Runner:
    """Runs batches of units for one :func:`simulate` call.

    Parameters
    ----------
    lms : (LoadedModel, LoadedModel)
        Models of agent 1 and agent 2 (possibly the same object).
    spec : CubeSpec
    tasks : dict task_index -> Task
    """

    def __init__(self, lms, spec: CubeSpec, tasks: dict, *, max_utterances, temperature,
                 max_new_tokens, batch_size, progress=None, sampling=({}, {}),
                 first_line_only=True, readers=None, tom_tasks=None, scheduling="turns", cache_budget=None,
                 reply_end="line", sync_timing=False):
        from synclib.engine import Engine

        self.scheduling = scheduling
        self.lms = lms
        engine_a = Engine(lms[0], batch_size=batch_size, max_cache_bytes=cache_budget)
        self.engines = (engine_a, engine_a if lms[1] is lms[0]
                        else Engine(lms[1], batch_size=batch_size, max_cache_bytes=cache_budget))
        for eng in self.engines:
            eng.sync_timing = bool(sync_timing)
        self.spec = spec
        self.tasks = tasks
        self.max_utterances = max_utterances
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.first_line_only = first_line_only
        self.reply_end = reply_end
        self.readers = readers or {}
        self.tom_tasks = tom_tasks  # task indices that get the ToM dialogs (None: all)
        self.progress = progress if progress is not None else _Progress(0, 0, "", show=False)

    # -- one batch ---------------------------------------------------------------------
    def run_batch(self, units: Sequence[tuple[int, int]]) -> list[Unit]:
        """Genuine dialogs (+ passive, + ToM) for whole units; returns filled Units."""
        out = [Unit.empty(self.spec, e, s) for e, s in units]
        tom = [i for i, (e, _) in enumerate(units)
               if self.spec.tom and (self.tom_tasks is None or e in self.tom_tasks)]
        try:
            if self.scheduling == "continuous":  # both views' dialogs in one stream, then the reader
                histories = self._dialog_stream([_Dialog(u, v, "active") for u, v in zip(units, out)]
                                                + [_Dialog(units[i], out[i], "tom") for i in tom])
            else:
                histories = self._dialog_turns(units, out, "active")
            if self.spec.passive:
                self._passive(units, out, histories)
            if tom and self.scheduling != "continuous":
                self._dialog_turns([units[i] for i in tom], [out[i] for i in tom], "tom")
        finally:
            for eng in self.engines:
                eng.clear()
            release_free_memory()  # the batch's sessions, freed: their pages go back
        return out

    def planned(self, unit) -> int:
        """Utterances planned for ``unit`` (episode, seed): its genuine dialog, the passive
        reader's reads and its ToM dialog, each to ``max_utterances``."""
        views = 1 + int(self.spec.passive and unit[1] in self.spec.read_passive_seeds())
        views += int(self.spec.tom and (self.tom_tasks is None or unit[0] in self.tom_tasks))
        return views * self.max_utterances

    def _on_step(self, n_tokens: int) -> None:
        self.progress.tokens(n_tokens)

    def _request(self, unit, t: int, history: list[str], view: str):
        """The request of utterance ``t`` of ``unit`` (episode, seed) in ``view``."""
        from synclib.engine import Request, row_seed

        agent = t % 2
        return Request(prompt=self.lms[agent].chat_prompt(render_prompt(self.tasks[unit[0]], agent, history, view)),
                       seed=row_seed(unit[1], unit[0], t, _TOM if view == "tom" else _GENUINE),
                       session=(unit[0], unit[1], agent, view))

    def _record(self, unit, value: Unit, t: int, res, view: str, history: list[str]) -> bool:
        """Store utterance ``t``'s reply ``res`` in ``value`` and ``history``; True when the
        episode goes on (no LEAVE, limit not reached)."""
        side, k = "ab"[t % 2], t // 2
        reply = postprocess_reply(res.text)
        if self.reply_end == "sentence" and res.finish_reason == "length":  # cut by the cap: end at a sentence
            reply = trim_to_sentence(reply)
        v = value.values
        v[var_name("hidden", side, view)][k] = res.states
        v[var_name("text", side, view)][k] = reply
        v[var_name("prompt_len", side, view)][k] = res.prompt_len
        history.append(reply)
        self.progress.advance(1)
        if is_leave(reply, self.tasks[unit[0]], t) or t + 1 >= self.max_utterances:
            reads = 1 + int(view == "active" and self.spec.passive and unit[1] in self.spec.read_passive_seeds())
            self.progress.drop(reads * (self.max_utterances - t - 1))
            return False
        return True

    def _forget(self, unit, view: str) -> None:
        """Drop an ended episode's sessions (both agents)."""
        for a in (0, 1):
            self.engines[a].forget((unit[0], unit[1], a, view))

    def _record_tom(self, value: Unit, t: int, emo, act, formatted) -> None:
        side, k = "ab"[t % 2], t // 2
        v = value.values
        v[var_name("emotion", side, "tom")][k] = emo
        v[var_name("action", side, "tom")][k] = act
        v[var_name("tom_format", side, "tom")][k] = formatted

    def _dialog_turns(self, units, out: list[Unit], view: str) -> list[list[str]]:
        """Play the dialogs of ``units`` in ``view`` turn by turn; fill ``out``.

        At utterance ``t`` every live dialog asks agent ``t % 2``'s model in one
        :meth:`~synclib.engine.Engine.generate` call, and the next utterance waits for the
        call's longest reply.

        Returns
        -------
        list of list of str: the post-processed utterances of every unit.
        """
        histories: list[list[str]] = [[] for _ in units]
        live = list(range(len(units)))
        for t in range(self.max_utterances):
            if not live:
                break
            agent = t % 2
            eng = self.engines[agent]
            reqs = [self._request(units[i], t, histories[i], view) for i in live]
            # only the first line of a reply is kept (postprocess_reply): generation may stop there
            res = eng.generate(reqs, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                               on_step=self._on_step, first_line_only=self.first_line_only,
                               **self.sampling[agent])
            if view == "tom":
                with eng.timed("tom"):
                    rows = _tom_readout(eng, reqs, res)
                for j, row in enumerate(zip(*rows)):
                    self._record_tom(out[live[j]], t, *row)
            still = []
            for j, i in enumerate(live):
                if self._record(units[i], out[i], t, res[j], view, histories[i]):
                    still.append(i)
                else:
                    self._forget(units[i], view)
            live = still
        for value, h in zip(out, histories):
            value.values[var_name("n_utterances", view=view)][...] = len(h)
        for eng in self.engines:  # this view's sessions are done: free the budget for the next
            eng.clear()
        return histories

    def _dialog_stream(self, dialogs: list["_Dialog"]) -> list[list[str]]:
        """Continuous batching (:class:`synclib.engine.DecodeStream`): each dialog's next
        utterance is submitted as soon as its reply ends, to the stream of the model that
        speaks next, so no dialog waits for another's longer reply, and the dialogs of every
        view (genuine and ToM) share the stream.  With two models the two streams take turns
        stepping.  Every utterance's request, seed and session are the turn-by-turn loop's,
        so the dialogs are the same up to float rounding.  ToM read-outs wait until a stream
        has ``batch_size`` replies to read (or the dialogs end) and are read in one batch
        (:func:`_tom_readout`).

        Returns
        -------
        list of list of str: the post-processed utterances of the active view's dialogs.
        """
        engines = list({id(e): e for e in self.engines}.values())
        streams = {id(e): e.stream(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                   first_line_only=self.first_line_only, capacity=len(dialogs),
                                   on_step=self._on_step, **self.sampling[self.engines.index(e)])
                   for e in engines}
        tom_wait = {id(e): [] for e in engines}  # (dialog, t, request, result) per engine

        def submit(d: _Dialog) -> None:
            d.asked = self._request(d.unit, d.turn, d.history, d.view)
            streams[id(self.engines[d.turn % 2])].submit(d, d.asked)

        def read_tom(eng, final=False) -> None:
            wait = tom_wait[id(eng)]
            if wait and (final or len(wait) >= self.engines[0].batch_size):
                with eng.timed("tom"):
                    rows = _tom_readout(eng, [w[2] for w in wait], [w[3] for w in wait], store=False)
                for (d, t, _, _), row in zip(wait, zip(*rows)):
                    self._record_tom(d.value, t, *row)
                wait.clear()
                pending = {id(d) for w in tom_wait.values() for d, *_ in w}
                for d in dialogs:
                    if d.status == "reading" and id(d) not in pending:
                        self._forget(d.unit, d.view)
                        d.status = "done"

        for d in dialogs:
            submit(d)
        while any(len(st) for st in streams.values()):
            for eng in engines:
                st = streams[id(eng)]
                if not len(st):
                    continue
                for d, res in st.step():
                    if d.view == "tom":
                        tom_wait[id(eng)].append((d, d.turn, d.asked, res))
                    if self._record(d.unit, d.value, d.turn, res, d.view, d.history):
                        d.turn += 1
                        submit(d)
                    elif d.view == "tom":
                        d.status = "reading"  # forgotten once its replies are read out
                    else:
                        self._forget(d.unit, d.view)
                        d.status = "done"
                read_tom(eng)
        for eng in engines:
            read_tom(eng, final=True)
            eng.clear()  # the views' sessions are done: free the budget for the passive reader
        for d in dialogs:
            d.value.values[var_name("n_utterances", view=d.view)][...] = len(d.history)
        return [d.history for d in dialogs if d.view == "active"]

    def _passive(self, units, out: list[Unit], histories: list[list[str]]) -> None:
        """Re-read the genuine dialogs with the passive view (prefill only).

        Only the units whose seed is among the spec's ``passive_seeds`` are read; the reader
        is told it is the persona drawn for (task, seed) (:func:`passive_persona`), recorded
        in ``passive_reader``.  Round by round, so that each reader's prompt extends its
        previous one and the engine re-uses that prefix's keys/values.
        """
        read = [i for i, (_, s) in enumerate(units) if s in self.spec.read_passive_seeds()]
        names = {}
        for i in read:
            persona = self.readers.get(units[i])
            out[i].values[var_name("reader", view="passive")][...] = persona.pk if persona is not None else ""
            names[i] = persona
        for agent in (0, 1):
            lm, eng, side = self.lms[agent], self.engines[agent], "ab"[agent]
            for t in range(agent, self.max_utterances, 2):
                rows = [i for i in read if t < len(histories[i])]
                if not rows:
                    break
                prompts = [lm.chat_prompt(render_prompt(self.tasks[units[i][0]], agent, histories[i][:t],
                                                        "passive", persona=names[i])) for i in rows]
                with eng.timed("passive"):
                    states = eng.read_states(prompts, sessions=[(units[i][0], units[i][1], agent, "passive")
                                                                for i in rows])
                for j, i in enumerate(rows):
                    out[i].values[var_name("hidden", side, "passive")][t // 2] = states[j]
                self.progress.advance(len(rows))
            eng.clear()


# --------------------------------------------------------------------------- public API

def default_batch_size(device) -> int:
    """Rows per batch when none is given: 64 on CUDA, 8 on CPU."""
    return 64 if str(device).startswith("cuda") else 8


def _as_model(m, dtype, device, prompt_format="chat_template"):
    from synclib.models import load_model

    if isinstance(m, str):
        return load_model(m, dtype=dtype, device=device, prompt_format=prompt_format)
    return m


def resolve_sampling(lm, top_k="model", top_p="model") -> dict:
    """The top-k / top-p a model samples with: ``"model"`` takes the model's own
    ``generation_config`` (:func:`synclib.models.sampling_settings`, transformers' defaults
    where it sets none), None switches the filter off, a number is used as it is.

    Returns
    -------
    dict ``{"top_k": int or None, "top_p": float or None}`` for
    :meth:`synclib.engine.Engine.generate`.
    """
    own = getattr(lm, "generation_defaults", None) or {"top_k": 50, "top_p": 1.0}
    k = own.get("top_k") if top_k == "model" else top_k
    p = own.get("top_p") if top_p == "model" else top_p
    if k is not None and (isinstance(k, bool) or int(k) != k or k < 0):
        raise ValueError(f"top_k must be 'model', None or an integer >= 0, got {top_k!r}")
    if p is not None and not 0 < float(p) <= 1:
        raise ValueError(f"top_p must be 'model', None or a number in (0, 1], got {top_p!r}")
    return {"top_k": None if not k else int(k), "top_p": None if p is None or float(p) >= 1 else float(p)}


def _check_settings(max_utterances, max_new_tokens, temperature, store_dtype, seeds, passive_seeds, scheduling,
                    tom_episodes, reply_end="line"):
    """Reject bad settings before any model is loaded; the message names the parameter."""
    if max_utterances < 1:
        raise ValueError(f"max_utterances must be >= 1, got {max_utterances}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if store_dtype not in STORE_DTYPES:
        raise ValueError(f"store_dtype must be one of {sorted(STORE_DTYPES)}, got {store_dtype!r}")
    if not seeds:
        raise ValueError("seeds: no seeds")
    if passive_seeds is not None:
        extra = sorted(set(passive_seeds) - set(seeds))
        if extra:
            raise ValueError(f"passive_seeds {extra} are not among seeds {seeds}")
    if scheduling not in SCHEDULING:
        raise ValueError(f"scheduling must be one of {', '.join(SCHEDULING)}, got {scheduling!r}")
    if reply_end not in REPLY_ENDS:
        raise ValueError(f"reply_end must be one of {', '.join(REPLY_ENDS)}, got {reply_end!r}")
    if tom_episodes is not None and (isinstance(tom_episodes, bool) or int(tom_episodes) != tom_episodes
                                     or tom_episodes < 1):
        raise ValueError(f"tom_episodes must be None or an integer >= 1, got {tom_episodes!r}")


def _load_pair(model_a, model_b, dtype, device, prompt_formats) -> tuple:
    """The two agents' models; the same spec in the same format is loaded once."""
    lm_a = _as_model(model_a, dtype, device, prompt_formats[0])
    same = model_b is model_a or (isinstance(model_b, str) and model_b == model_a
                                  and prompt_formats[0] == prompt_formats[1])
    return lm_a, (lm_a if same else _as_model(model_b, dtype, device, prompt_formats[1]))


def _batch_size(batch_size, out: Path, device) -> int:
    """The given rows per batch, else an unfinished run's, else :func:`default_batch_size`."""
    if batch_size is None:
        old = CubeWriter.existing_spec(out)
        batch_size = int(old["attrs"]["batch_size"]) if old and "batch_size" in old.get("attrs", {}) \
            else default_batch_size(device)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return batch_size


def _add_engine_stats(engine_stats: dict, engines) -> None:
    """Add the engines' counters (each engine once), their budgets' peaks and their wall
    seconds per category (``seconds_<category>``, see ``Engine.seconds``) to ``engine_stats``."""
    for eng in {id(e): e for e in engines}.values():
        for k, v in eng.stats.items():
            engine_stats[k] = engine_stats.get(k, 0) + int(v)
        for k, v in eng.seconds.items():
            engine_stats[f"seconds_{k}"] = round(engine_stats.get(f"seconds_{k}", 0) + v, 3)
    budgets = {id(e.budget): e.budget for e in engines}.values()
    engine_stats["cache_peak_bytes"] = engine_stats.get("cache_peak_bytes", 0) + sum(b.peak for b in budgets)


def _play(runner: "_Runner", writer: CubeWriter, units: list, batch_size: int, progress: bool,
          engine_stats: dict | None) -> Path:
    """Play the batches of ``units`` the cube does not hold yet, each written as a part when it
    ends; the finished cube."""
    batches = [units[i:i + batch_size] for i in range(0, len(units), batch_size)]
    todo = [(b, batch) for b, batch in enumerate(batches)
            if not (writer.has_part(b) and all(u in writer.done for u in batch))]
    planned = sum(runner.planned(u) for u in units)
    runner.progress = _Progress(planned, planned - sum(runner.planned(u) for _, b in todo for u in b),
                                f"simulate {writer.path.name}", progress)
    eng = runner.engines[0]
    try:
        for b, batch in todo:
            part = runner.run_batch(batch)
            with eng.timed("cube"):
                writer.write_part(b, part)
        with eng.timed("cube"):
            path = writer.finalize()
    finally:
        runner.progress.close()
        if engine_stats is not None:
            _add_engine_stats(engine_stats, runner.engines)
    return path


def simulate(model_a, model_b, tasks, seeds, out, *, max_utterances: int = 16,
             temperature: float = 0.7, max_new_tokens: int = 300, passive: bool = False,
             tom: bool = False, batch_size: int | None = None, device=None, dtype=None,
             store_dtype: str = "float32", overwrite: bool = False, progress: bool = True,
             top_k="model", top_p="model", stop_at_first_line: bool = True,
             passive_seeds=None, taskset: TaskSet | None = None,
             prompt_formats: tuple[str, str] = ("chat_template", "chat_template"),
             tom_episodes: int | None = None, engine_stats: dict | None = None,
             scheduling: str = "turns", cache_gib="auto", reply_end: str = "line",
             sync_timing: bool = False) -> Path:
    """Run model A (agent 1) against model B (agent 2) and write a cube.

    Parameters
    ----------
    model_a, model_b : str or LoadedModel
        Model specs (see :func:`synclib.models.load_model`) or loaded models; the same
        spec is loaded once.
    tasks : TaskSet or sequence of Task
        The episodes; their ``index`` is the cube's ``episode`` coordinate.
    seeds : sequence of int
        Simulation seeds (``sim_seed``).
    out : path of the ``.nc`` cube
    max_utterances : int, default 16
    temperature : float, default 0.7 (0 = greedy)
    max_new_tokens : int, default 300
    passive : bool
        Also re-read the genuine dialogs as a passive reader (``hidden_*_passive``).
    tom : bool
        Also run the Theory-of-Mind dialogs (``*_tom``, ``emotion_*``, ``action_*``).
    tom_episodes : int, optional
        With ``tom``: play the ToM dialogs for the first this many of ``tasks`` only (all
        their seeds); the other units' ToM variables stay unreached (``n_utterances_tom``
        -1).  Default: every task.
    batch_size : int, optional
        Rows per batch (also the unit of crash-safe writing); default
        :func:`default_batch_size`, or the unfinished run's value when resuming.
    device, dtype : passed to :func:`synclib.models.load_model` for specs.
    store_dtype : {"float32", "float16", "bfloat16"}
    overwrite : bool
        Replace a finished cube at ``out`` (otherwise it is returned untouched).
    progress : bool
        Show a tqdm bar on stderr where it is a terminal: utterances generated and read of
        those planned, elapsed and remaining time, new tokens/s.
    top_k, top_p : "model", None or a number
        Sampling filters per :func:`resolve_sampling` (default: each model's own, as the
        paper's code sampled with ``transformers``' ``generate``).
    stop_at_first_line : bool, default True
        Stop a reply at its first complete line (only that line is kept).
    reply_end : {"line", "sentence"}, default "line"
        A reply cut by ``max_new_tokens``: kept (the reference), or cut back to its last complete
        sentence where it has one (:func:`synclib.prompts.trim_to_sentence`; ours, the same tokens).
    passive_seeds : sequence of int, optional
        The seeds the passive reader reads (default: all of ``seeds``; the paper: 0-2).
    taskset : TaskSet, optional
        The set the passive reader's persona is drawn from (:func:`passive_persona`);
        default ``tasks`` when it is a TaskSet.  Without one the reader is told it is the
        agent it replaces.
    scheduling : {"turns", "continuous"}, default "turns"
        How a batch's dialogs share the models (:data:`synclib.engine.SCHEDULING`): ``"turns"``, utterance
        by utterance, each waiting for the batch's longest reply; ``"continuous"``, each
        dialog's next utterance joins the running batch as soon as its reply ends
        (:class:`synclib.engine.DecodeStream`).  The same requests, seeds and sessions:
        texts and states agree up to float rounding.
    cache_gib : "auto" or number, default "auto"
        Memory the session caches of both models may hold together, in GiB
        (:func:`synclib.memory.session_budget`; ``"auto"``: a quarter of the memory available,
        256 MiB to 4 GiB).  Sessions that do not fit are recomputed on their next turn
        (``engine_stats["recomputed_tokens"]``): the same dialogs, more time.  On CUDA
        ``"auto"`` leaves each engine its own share of the device memory.
    engine_stats : dict, optional
        Filled with this call's engine counters, both models summed (``prefill_tokens``,
        ``reused_tokens``, ``graph_steps``, ...; see :class:`synclib.engine.Engine`),
        ``cache_peak_bytes`` (the most the session caches held at once) and wall seconds per
        part (``seconds_decode``/``_join``/``_generate``/``_passive``/``_tom``/``_cube``).
    sync_timing : bool, default False
        ``Engine.sync_timing``: those seconds count GPU work where it was launched (benchmarks).
    prompt_formats : (str, str)
        Prompt formats of A and B when they are given as specs
        (:data:`synclib.models.PROMPT_FORMATS`).

    Returns
    -------
    Path of the finished cube.
    """
    out = Path(out)
    seeds = [int(s) for s in seeds]
    passive_seeds = None if passive_seeds is None else [int(s) for s in passive_seeds]
    _check_settings(max_utterances, max_new_tokens, temperature, store_dtype, seeds, passive_seeds, scheduling,
                    tom_episodes, reply_end)
    if taskset is None and isinstance(tasks, TaskSet):
        taskset = tasks
    tasks = list(tasks)
    if not tasks:
        raise ValueError("no tasks to simulate")
    tom_tasks = None if not tom or tom_episodes is None else {t.index for t in tasks[:int(tom_episodes)]}
    budget = session_budget(cache_gib)  # checks the setting before any model loads
    if is_complete(out) and not overwrite:
        return out
    lm_a, lm_b = _load_pair(model_a, model_b, dtype, device, prompt_formats)
    sampling = (resolve_sampling(lm_a, top_k, top_p), resolve_sampling(lm_b, top_k, top_p))
    batch_size = _batch_size(batch_size, out, lm_a.device)
    spec = _cube_spec(lm_a, lm_b, tasks, seeds, passive=passive, tom=tom, passive_seeds=passive_seeds,
                      store_dtype=store_dtype, sampling=sampling, attrs=dict(
                          temperature=float(temperature), max_new_tokens=int(max_new_tokens),
                          max_utterances=int(max_utterances), batch_size=int(batch_size), scheduling=scheduling,
                          stop_at_first_line=bool(stop_at_first_line), reply_end=str(reply_end),
                          tom_episodes=len(tom_tasks) if tom_tasks is not None else (len(tasks) if tom else 0),
                          passive_persona_rule=PASSIVE_PERSONA_RULE if taskset is not None
                          else "the reader is told it is the agent it replaces"))
    writer = CubeWriter(out, spec, overwrite=overwrite)
    units = spec.units()
    readers = {} if not passive or taskset is None else {
        (e, s): passive_persona(taskset, e, s) for e, s in units if s in spec.read_passive_seeds()}

    shared = None if lm_a.device.type == "cuda" and cache_gib == "auto" else CacheBudget(budget)
    runner = _Runner((lm_a, lm_b), spec, {t.index: t for t in tasks}, max_utterances=max_utterances,
                     temperature=temperature, max_new_tokens=max_new_tokens, batch_size=batch_size,
                     sampling=sampling, first_line_only=stop_at_first_line, readers=readers, tom_tasks=tom_tasks,
                     scheduling=scheduling, reply_end=reply_end, cache_budget=shared, sync_timing=sync_timing)
    return _play(runner, writer, units, batch_size, progress, engine_stats)


def _cube_spec(lm_a, lm_b, tasks, seeds, *, passive, tom, passive_seeds, store_dtype, sampling,
               attrs) -> CubeSpec:
    """The cube's layout and identity: shapes, models, every generation setting."""
    import torch

    models = {}
    for side, lm, samp in (("a", lm_a, sampling[0]), ("b", lm_b, sampling[1])):
        models.update({f"model_{side}": lm.name, f"model_{side}_source": getattr(lm, "source", ""),
                       f"torch_dtype_{side}": str(lm.dtype).replace("torch.", ""),
                       f"prompt_format_{side}": getattr(lm, "prompt_format", "chat_template"),
                       f"top_k_{side}": samp["top_k"] or 0, f"top_p_{side}": samp["top_p"] or 1.0})
    spec = CubeSpec(
        episodes=[episode_coords(t) for t in tasks], seeds=seeds,
        n_rounds=math.ceil(attrs["max_utterances"] / 2),
        n_layers_a=lm_a.n_layers, d_model_a=lm_a.d_model,
        n_layers_b=lm_b.n_layers, d_model_b=lm_b.d_model,
        passive=passive, tom=tom, emotions=EMOTIONS, actions=ACTIONS, store_dtype=store_dtype,
        passive_seeds=passive_seeds if passive else None,
        attrs=dict(**models, **attrs, synclib_version=__version__, torch_version=torch.__version__,
                   protocol="protocol.md (Sotopia dialog loop, last-prompt-token states)"),
    )
    if not tom:  # the word lists only matter for ToM cubes; keep the spec minimal
        spec.emotions, spec.actions = [], []
    return spec

