"""The loop that plays the parts of a run: :class:`_Runner` and its progress bar.

A part's units become :class:`~synclib.simulate.dialog.Dialog` objects (one per unit and view) held by a
:class:`~synclib.simulate.dialog.Scheduler`; one loop repeats :meth:`_Runner._step` (schedule, one step of each
model's :class:`~synclib.engine.DecodeStream`, postprocess).  ``"turns"`` plays the parts one after the other in
streams that are not refilled: genuine dialogs, then the passive reader, then the ToM dialogs.  ``"continuous"``
keeps one refilled stream per model for all the parts (:meth:`_Runner._continuous`).  Each part goes to the cube's
writer as soon as all its units are done.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from synclib.cube import CubeSpec, CubeWriter, Unit, var_name
from synclib.engine import Engine, Request, row_seed
from synclib.memory import release_free_memory
from synclib.simulate.dialog import Dialog, Scheduler, Status
from synclib.simulate.options import Batching, Sampling
from synclib.simulate.readout import TomReadout
from synclib.tasks.prompts import is_leave, postprocess_reply, render_prompt, trim_to_sentence

__all__ = ["_Runner", "_Progress"]

# run kinds, mixed into the per-row seeds
_GENUINE, _TOM = 0, 1


class _Progress:
    """The simulation's progress in utterances generated (genuine and ToM dialogs) and read (the passive reader): a
    tqdm bar on stderr, shown on terminals only (``disable=None``), of ``total`` utterances planned, ``done`` of them
    already (a resumed run's finished parts).  The plan, every dialog's ``max_utterances``, shrinks as dialogs end."""

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

    def unplan(self, n: int) -> None:
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


@dataclass(eq=False)
class _Part:
    """A cube part in play: its id, its units' cube cells and its dialogs (genuine, then ToM)."""

    id: int
    cells: list
    dialogs: list

    @property
    def genuine(self) -> list[Dialog]:
        """The genuine dialogs (view ``"active"``); the analysis' condition ``"genuine"`` pairs their states."""
        return [d for d in self.dialogs if d.view == "active"]


class _Runner:
    """Plays the parts of one :func:`~synclib.simulate.simulate` call, handing each to the cube's writer as it ends.

    Parameters
    ----------
    lms : (LoadedModel, LoadedModel)
        Models of agent 1 and agent 2 (possibly the same object).
    spec : CubeSpec
    tasks : dict task_index -> Task
    max_utterances : int
    sampling : (Sampling, Sampling)
        Each agent's sampling, its filters resolved for its model (:meth:`Sampling.for_model`).
    batching : Batching
        ``max_rows`` must be set (:meth:`Batching.resolve`); ``max_in_flight`` and ``kv_tokens`` as there.
    readers : dict (episode, seed) -> Persona, optional: the passive reader's personas
    tom_tasks : set of int, optional: the task indices that get the ToM dialogs (None: all)
    cache_budget : CacheBudget, optional: the budget both engines share (None: each engine's own default)
    """

    def __init__(self, lms, spec: CubeSpec, tasks: dict, *, max_utterances: int, sampling: tuple[Sampling, Sampling],
                 batching: Batching = Batching(), readers=None, tom_tasks=None, cache_budget=None):
        if batching.max_rows is None:
            raise ValueError("batching.max_rows must be set (Batching.resolve fills it in)")
        self.lms = lms
        self.batching = batching
        engine_a = Engine(lms[0], max_rows=batching.max_rows, max_cache_bytes=cache_budget)
        self.engines = (engine_a, engine_a if lms[1] is lms[0]
                        else Engine(lms[1], max_rows=batching.max_rows, max_cache_bytes=cache_budget))
        self.spec = spec
        self.tasks = tasks
        self.max_utterances = max_utterances
        self.sampling = tuple(sampling)
        if len(self.sampling) != 2:
            raise ValueError(f"sampling must be one Sampling per agent (two), got {len(self.sampling)}")
        self.readers = readers or {}
        self.tom_tasks = tom_tasks
        self.progress = _Progress(0, 0, "", show=False)
        self._tom: dict[int, TomReadout] = {}
        #: each agent's :class:`~synclib.engine.DecodeStream` (one object when one model plays both)
        self.streams = None

    # -- the parts ---------------------------------------------------------------------
    def plays_tom(self, unit) -> bool:
        """Whether ``unit`` (episode, seed) gets a ToM dialog."""
        return self.spec.tom and (self.tom_tasks is None or unit[0] in self.tom_tasks)

    def play(self, parts: Sequence[tuple[int, Sequence]], writer: CubeWriter) -> None:
        """Play ``parts`` ((part id, units) pairs), handing each to ``writer`` once its units are done: ``"turns"``
        part after part (:meth:`play_part`), ``"continuous"`` in one stream per model (:meth:`_continuous`)."""
        if self.continuous:
            self._continuous(parts, writer)
            return
        for b, units in parts:
            self._write(writer, b, self.play_part(units))

    @property
    def continuous(self) -> bool:
        """Whether the run is scheduled ``"continuous"`` (else ``"turns"``)."""
        return self.batching.scheduling == "continuous"

    def play_part(self, units: Sequence[tuple[int, int]]) -> list[Unit]:
        """One part turn by turn: genuine dialogs, passive reader (:meth:`_read_after`), ToM dialogs; its Units."""
        part = self._part(0, units)
        tom = [d for d in part.dialogs if d.view == "tom"]
        if self.streams is None or self.streams[0].refill:
            self._open_streams(self.engines[0].max_rows, refill=False)
        try:
            self._turns(part.genuine)
            if self.spec.passive:
                self._read_after(part.genuine)
            if tom:
                self._turns(tom)
        finally:
            for eng in self.engines:
                eng.clear()
            release_free_memory()  # the part's sessions, freed: their pages go back
        return part.cells

    def _part(self, part_id: int, units: Sequence[tuple[int, int]]) -> _Part:
        """Part ``part_id`` of ``units``: empty cube cells, a genuine dialog per unit, then the ToM ones."""
        cells = [Unit.empty(self.spec, e, s) for e, s in units]
        dialogs = [Dialog(c, "active") for c in cells]
        dialogs += [Dialog(c, "tom") for c in cells if self.plays_tom((c.episode, c.seed))]
        return _Part(part_id, cells, dialogs)

    def _write(self, writer: CubeWriter, part_id: int, cells: list[Unit]) -> None:
        """Hand a finished part to ``writer``, waiting only while the previous one is written (``seconds_cube``)."""
        with self.engines[0].timed("cube"):
            writer.submit_part(part_id, cells)

    def planned(self, unit) -> int:
        """Utterances planned for ``unit`` (episode, seed): ``max_utterances`` per dialog and passive re-reading."""
        views = 1 + len(self.reader_views(unit))
        views += int(self.plays_tom(unit))
        return views * self.max_utterances

    def _on_step(self, n_tokens: int) -> None:
        self.progress.tokens(n_tokens)

    def _engine_args(self, agent: int) -> dict:
        """``generate`` / ``stream`` keywords of ``agent``'s model."""
        s = self.sampling[agent]
        return dict(max_new_tokens=s.max_new_tokens, temperature=s.temperature, on_step=self._on_step,
                    first_line_only=s.stop_at_first_line, **s.filters)

    # -- schedule, run, postprocess ------------------------------------------------------
    def _request(self, d: Dialog):
        """The request of ``d``'s current utterance (its prompt as token ids)."""
        agent = d.agent
        lm = self.lms[agent]
        return Request(prompt=lm.encode(lm.chat_prompt(render_prompt(self.tasks[d.unit[0]], agent, d.history, d.view))),
                       seed=row_seed(d.unit[1], d.unit[0], d.turn, _TOM if d.view == "tom" else _GENUINE),
                       session=d.session(agent))

    def _record(self, d: Dialog, res) -> bool:
        """Store reply ``res`` of ``d``'s current utterance in its cells and history; True when the dialog goes on."""
        t = d.turn
        side, k = "ab"[t % 2], t // 2
        reply = postprocess_reply(res.text)
        if self.sampling[d.agent].reply_end == "sentence" and res.finish_reason == "length":  # cut by the cap
            reply = trim_to_sentence(reply)
        v = d.cells.values
        v[var_name("hidden", side, d.view)][k] = res.states
        v[var_name("text", side, d.view)][k] = reply
        v[var_name("prompt_len", side, d.view)][k] = res.prompt_len
        d.history.append(reply)
        self.progress.advance(1)
        if is_leave(reply, self.tasks[d.unit[0]], t) or t + 1 >= self.max_utterances:
            reads = 1 + (len(self.reader_views(d.unit)) if d.view == "active" else 0)
            self.progress.unplan(reads * (self.max_utterances - t - 1))
            return False
        return True

    def _postprocess(self, sched: Scheduler, d: Dialog, res) -> None:
        """Record ``d``'s reply, then advance it or finish it."""
        if self._record(d, res):
            sched.advance(d)
        else:
            self._finish(sched, d)

    def _finish(self, sched: Scheduler, d: Dialog) -> None:
        """An ended dialog: its sessions (both agents) dropped, its length recorded."""
        for a in (0, 1):
            self.engines[a].forget(d.session(a))
        d.cells.values[var_name("n_utterances", view=d.view)][...] = len(d.history)
        sched.finish(d)

    def _tom_of(self, agent: int) -> TomReadout:
        """The ToM read-out of ``agent``'s model (made once per model)."""
        lm = self.lms[agent]
        if id(lm) not in self._tom:
            self._tom[id(lm)] = TomReadout(lm)
        return self._tom[id(lm)]

    def _record_tom(self, cells: Unit, t: int, emo, act, formatted) -> None:
        side, k = "ab"[t % 2], t // 2
        v = cells.values
        v[var_name("emotion", side, "tom")][k] = emo
        v[var_name("action", side, "tom")][k] = act
        v[var_name("tom_format", side, "tom")][k] = formatted

    # -- the loop --------------------------------------------------------------------------
    def _open_streams(self, capacity: int, refill: bool) -> None:
        """One :class:`~synclib.engine.DecodeStream` per model (:attr:`streams`, by agent) of ``capacity`` rows: for
        ``"turns"`` not refilled, for ``"continuous"`` refilled, with ``batching.kv_tokens``."""
        made = {}
        for agent, eng in enumerate(self.engines):
            if id(eng) not in made:
                made[id(eng)] = eng.stream(capacity=capacity, kv_tokens=self.batching.kv_tokens if refill else None,
                                           refill=refill, **self._engine_args(agent))
        self.streams = tuple(made[id(e)] for e in self.engines)

    def _step(self, sched: Scheduler, fresh: deque | None = None, capacity: int = 0) -> None:
        """One step of the loop, for each model's stream in turn: schedule (:meth:`_submit`), run one
        :meth:`DecodeStream.step`, postprocess the replies ``sched`` hands back (ToM read-outs and replies recorded,
        dialogs advanced or finished) and the passive reads."""
        for st in dict.fromkeys(self.streams):
            self._submit(sched, fresh, capacity)
            if not (len(st) or st.reads_waiting):
                continue
            for d, res in st.step():
                for d, res in sched.replied(d, res):
                    if d.view == "tom":
                        self._record_tom(d.cells, d.turn, *self._tom_of(d.agent).from_scores(res))
                    self._postprocess(sched, d, res)
            for (d, t, view), states in st.take_reads():
                d.reads -= 1
                self._record_passive(d, t, view, states)

    def _submit(self, sched: Scheduler, fresh: deque | None = None, capacity: int = 0) -> None:
        """Submit the requests of the dialogs ``sched`` schedules to the stream of the model that speaks (``"turns"``:
        in :meth:`Engine.order`, so each batch is the one :meth:`Engine.generate` would make; ``"continuous"``: with
        the passive reader's prompt of a genuine utterance, :meth:`_read`); start ``fresh`` dialogs while agent 1's
        stream holds fewer than ``capacity`` rows."""
        first, continuous = self.streams[0], sched.policy == "continuous"
        while True:
            batch = sched.schedule()
            for d in batch:
                d.request = self._request(d)
            if batch and not continuous:  # one turn: every dialog at it, one agent
                eng = self.engines[batch[0].agent]
                batch = [batch[i] for i in eng.order([d.request.prompt for d in batch],
                                                     [d.request.session for d in batch])]
            for d in batch:
                self.streams[d.agent].submit(d, d.request, self._tom_of(d.agent).probe if d.view == "tom" else None)
                if continuous and d.view == "active" and self.reads_passive(d.unit):
                    if d.turn == 0:
                        self._mark_reader(d)
                    for view in self.reader_views(d.unit):
                        self._read(d, d.agent, d.turn, view)
            room = min(len(fresh), capacity - len(first)) if fresh else 0
            if room <= 0:
                return
            sched.add([fresh.popleft() for _ in range(room)])

    def _turns(self, dialogs: list[Dialog]) -> None:
        """Play ``dialogs`` (one view of a part) turn by turn (``policy="turns"``), then drop this view's sessions."""
        sched = Scheduler(dialogs, policy="turns")
        while sched:
            self._step(sched)
        for eng in self.engines:
            eng.clear()

    def _continuous(self, parts: Sequence[tuple[int, Sequence]], writer: CubeWriter) -> None:
        """Continuous batching over all ``parts``: one refilled stream per model for the whole call, each dialog's
        next utterance submitted as soon as its reply ends, new dialogs starting while agent 1's stream holds fewer
        than ``capacity`` rows (:meth:`Batching.stream_capacity`).  The next part is in play beside the oldest (at
        most two parts' cells held, the one being written included); a part whose units are all done goes to
        ``writer`` between steps; a dialog's sessions are dropped when it ends, the reader's when its part is done."""
        if not parts:
            return
        capacity = self.batching.stream_capacity([sum(1 + self.plays_tom(u) for u in us) for _, us in parts])
        self._open_streams(capacity, refill=True)
        todo, in_play, fresh, sched = deque(parts), [], deque(), Scheduler(policy="continuous")
        while todo or in_play:
            while todo and len(in_play) + int(writer.writing) < 2:
                part = self._part(*todo.popleft())
                in_play.append(part)
                fresh.extend(part.dialogs)
            self._step(sched, fresh, capacity)
            for part in [p for p in in_play if self._settle(p)]:
                in_play.remove(part)
                sched.remove(part.dialogs)
                self._write(writer, part.id, part.cells)
                release_free_memory()  # the part's sessions, freed: their pages go back

    def _settle(self, part: _Part) -> bool:
        """Whether all of ``part`` is done (dialogs ended, passive reads made); if so, drop the reader's sessions."""
        if any(d.status is not Status.FINISHED or d.reads for d in part.dialogs):
            return False
        for d in part.genuine:  # the reader's sessions: read to the end
            for view in self.reader_views(d.unit):
                for agent in (0, 1):
                    self.engines[agent].forget(d.session(agent, view))
        return True

    # -- the passive reader --------------------------------------------------------------
    def reads_passive(self, unit) -> bool:
        """Whether the passive reader reads ``unit`` (episode, seed): its seed is among the spec's ``passive_seeds``."""
        return self.spec.passive and unit[1] in self.spec.read_passive_seeds()

    def reader_views(self, unit) -> tuple[str, ...]:
        """The readers of ``unit``: ``"passive"`` (the drawn persona) and, with the spec's ``passive_own``,
        ``"passive_own"`` (told it is the agent it replaces); none where it is not read."""
        if not self.reads_passive(unit):
            return ()
        return ("passive", "passive_own") if self.spec.passive_own else ("passive",)

    def _mark_reader(self, d: Dialog) -> None:
        """Record in ``passive_reader`` the persona the reader of ``d`` is told it is
        (:func:`passive_persona` of (task, seed); empty when it is told it is the agent it replaces)."""
        persona = self.readers.get(d.unit)
        d.cells.values[var_name("reader", view="passive")][...] = persona.pk if persona is not None else ""

    def _passive_prompt(self, d: Dialog, agent: int, t: int, view: str = "passive") -> str:
        """The reader ``view``'s prompt for utterance ``t`` of ``d`` in ``agent``'s place: the dialog before it."""
        persona = self.readers.get(d.unit) if view == "passive" else None
        return self.lms[agent].chat_prompt(render_prompt(self.tasks[d.unit[0]], agent, d.history[:t], "passive",
                                                         persona=persona))

    def _read(self, d: Dialog, agent: int, t: int, view: str = "passive", prompt=None) -> None:
        """Queue the reader ``view``'s read of utterance ``t`` of ``d`` in ``agent``'s place on that model's stream
        (``prompt``: :meth:`_passive_prompt` or its token ids; session ``d.session(agent, view)``)."""
        prompt = self._passive_prompt(d, agent, t, view) if prompt is None else prompt
        self.streams[agent].read((d, t, view), prompt, d.session(agent, view))
        d.reads += 1

    def _read_after(self, dialogs: list[Dialog]) -> None:
        """``"turns"``: re-read the genuine ``dialogs`` after they ended, round by round, so that each reader's prompt
        extends its previous one (its keys/values reused); a round's reads in :meth:`Engine.order`,
        :attr:`Engine.max_rows` a forward (the batches of :meth:`Engine.read_states`)."""
        read = [d for d in dialogs if self.reads_passive(d.unit)]
        for d in read:
            self._mark_reader(d)
        idle = Scheduler(policy="turns")
        views = self.reader_views(read[0].unit) if read else ()
        for agent in (0, 1):
            eng = self.engines[agent]
            for t in range(agent, self.max_utterances, 2):
                rows = [(d, v) for d in read if t < len(d.history) for v in views]
                if not rows:
                    break
                prompts = [self.lms[agent].encode(self._passive_prompt(d, agent, t, v)) for d, v in rows]
                for i in eng.order(prompts, [d.session(agent, v) for d, v in rows]):
                    self._read(rows[i][0], agent, t, rows[i][1], prompts[i])
                while any(d.reads for d, _ in rows):
                    self._step(idle)
            for d in read:  # only the readers' sessions: other dialogs may be in flight
                for v in views:
                    eng.forget(d.session(agent, v))

    def _record_passive(self, d: Dialog, t: int, view: str, states) -> None:
        """Store the reader ``view``'s states of utterance ``t`` of ``d``."""
        d.cells.values[var_name("hidden", "ab"[t % 2], view)][t // 2] = states
        self.progress.advance(1)

