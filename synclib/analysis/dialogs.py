"""The dialogs of a run's cubes as the simulator stored them, and the prompts the models read at one turn.

:func:`collect_dialogs` reads every ordered run of a results directory, :func:`dialogs_from_cube` one cube.  A
:class:`Dialog` is one episode and simulation seed of a cube: its task's texts as the judge sees them (from the
task set the manifest's config names, :func:`load_run_tasks`, matched by task index, scenario id and agent ids;
Sotopia's tags removed by :func:`synclib.tasks.prompts.render_text`; an unmatched episode has the cube's names and
no goals), every turn as stored (utterance ``2k`` is ``text_a[..., k]``, ``2k+1`` ``text_b[..., k]``, after
:func:`synclib.tasks.prompts.postprocess_reply`; the raw generation is not stored), why it ended
(:func:`end_reason`), the judge's scores and reasoning per agent and dimension (none outside ``judge.sample``)
and, where the cube has one, the Theory-of-Mind dialog on the same task and seed (``text_*_tom``) with each
turn's most probable emotion and action words and probabilities (``emotion_*``, ``action_*``) and whether it
followed the instructed format (``tom_format_*``).

:func:`dialog_turn_prompts` picks one turn of one dialog; :func:`turn_prompts` gives its three prompts (the
speaker's, the passive reader's, the ToM dialog's) in :func:`synclib.tasks.prompts.masked_prompt`'s parts, which
locate what masking the other agent's profile removed or replaced.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from synclib.cube import open_cube
from synclib.tasks import datasets
from synclib.tasks.prompts import (ACTIONS, EMOTIONS, is_leave, is_leave_line, masked_prompt, passive_persona,
                                   render_text, speaker_line)
from synclib.tasks.scenarios import RELATIONSHIPS, ScenarioError, load_tasks

__all__ = ["END_REASONS", "Turn", "Transcript", "Score", "Dialog", "RunDialogs", "DialogSet", "end_reason",
           "ends_a_sentence", "load_run_tasks", "dialogs_from_cube", "collect_dialogs", "ViewPrompt", "TurnPrompts",
           "turn_prompts", "dialog_turn_prompts"]

#: how a dialog can end (:func:`end_reason`)
END_REASONS = ("leave", "limit", "other")


@dataclass(frozen=True)
class Turn:
    """Utterance ``index`` (0-based, the prompts' ``Turn t``) by agent ``agent`` (``index % 2 + 1``).  ToM dialogs
    only: the most probable emotion word and action type with their probabilities (``None`` where the cube holds
    NaN) and ``tom_format`` (1: the reply opened with an emotion then an action word, 0: not, ``None``: unknown)."""

    index: int
    agent: int
    speaker: str
    text: str
    emotion: str | None = None
    emotion_p: float | None = None
    action: str | None = None
    action_p: float | None = None
    tom_format: int | None = None


@dataclass(frozen=True)
class Transcript:
    """One dialog's turns (``view``: ``"genuine"`` or ``"tom"``) and why it ended (``end``, of :data:`END_REASONS`)."""

    view: str
    turns: tuple[Turn, ...]
    end: str

    @property
    def n_utterances(self) -> int:
        return len(self.turns)


@dataclass(frozen=True)
class Score:
    """One judge row: agent ``agent`` (1 or 2) on ``dimension``; ``score`` is ``None`` when missing."""

    agent: int
    agent_name: str
    dimension: str
    score: int | None
    reasoning: str = ""
    error: str = ""


@dataclass(frozen=True)
class Dialog:
    """One dialog of an ordered run (module docstring).  ``goals``, ``scenario``: ``None`` without the task's
    texts; ``max_utterances``: the run's limit (``None``: unknown); ``passive_reader``: the persona that re-read
    the dialog, ``"Name (id)"`` where the task set has it (``""``: none), ``passive_reader_id`` its id."""

    run: str
    pair: str
    order: int
    model_a: str
    model_b: str
    family: str
    episode: int
    task_index: int
    sim_seed: int
    codename: str
    source: str
    relationship: str
    scenario: str | None
    names: tuple[str, str]
    goals: tuple[str, str] | None
    max_utterances: int | None
    genuine: Transcript
    tom: Transcript | None = None
    scores: tuple[Score, ...] = ()
    judge: str = ""
    passive_reader: str = ""
    has_judge_table: bool = True
    passive_reader_id: str = ""

    @property
    def key(self) -> str:
        return f"{self.run}/e{self.episode}/s{self.sim_seed}"


@dataclass
class RunDialogs:
    """One ordered run's dialogs: ``total`` in its cube, ``shown`` kept, ``left_out`` the others' (episode, seed),
    ``counts`` as :attr:`DialogSet.counts`; ``max_utterances`` the cube's limit (else the config's); task indices
    ``mismatched_tasks`` (not matching the cube's scenario or agent ids) and ``missing_tasks`` (not in the task set)."""

    name: str
    pair: str
    order: int
    model_a: str
    model_b: str
    family: str
    total: int = 0
    shown: int = 0
    left_out: list = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    has_cube: bool = True
    has_judge_table: bool = True
    max_utterances: int | None = None
    mismatched_tasks: list = field(default_factory=list)
    missing_tasks: list = field(default_factory=list)


@dataclass
class DialogSet:
    """The dialogs of a results directory (:func:`collect_dialogs`): ``dialogs`` those kept (at most
    ``max_dialogs_per_run`` per run), ``runs`` a :class:`RunDialogs` per run, ``counts`` over *all* the cubes'
    dialogs (``dialogs``, ``leave``, ``limit``, ``other``, ``judged``, ``tom``, ``tom_leave``, ``tom_limit``,
    ``tom_other``, ``utterances``, ``mid_sentence``: utterances not ending a sentence); ``tasks`` the run's task set
    or ``None`` for the reason ``tasks_missing``; ``reply_cap`` ``simulate.max_new_tokens`` and ``reply_end``."""

    dialogs: list
    runs: list
    counts: dict
    name: str = ""
    embedded: bool = False
    synthetic: bool = False
    max_dialogs_per_run: int | None = None
    judge_sample: int | None = None
    reply_cap: dict | None = None
    scenarios: str | None = None
    tasks: object = None
    tasks_missing: str = ""


# --------------------------------------------------------------------------- rules
def end_reason(utterances, max_utterances: int | None, task=None, names=None) -> str:
    """Why a dialog of ``utterances`` (as stored) ended: ``"leave"`` when the last meets the LEAVE rule (even if it
    was the last allowed), ``"limit"`` at ``max_utterances`` (``None``: unknown), else ``"other"``.  The rule: with
    ``task`` the simulator's :func:`synclib.tasks.prompts.is_leave` ``(last, task, turn)``; else with ``names``
    (agent 1's, agent 2's) the same on the dialog line; else on the utterance alone."""
    n = len(utterances)
    if n == 0:
        return "other"
    t, last = n - 1, str(utterances[-1])
    if task is not None:
        leave = is_leave(last, task, t)
    elif names is not None:
        leave = is_leave_line(speaker_line(tuple(names), t, last))
    else:
        leave = is_leave(last)
    return "leave" if leave else "limit" if max_utterances is not None and n >= max_utterances else "other"


def ends_a_sentence(text: str) -> bool:
    """Whether ``text`` ends with ``.``, ``!`` or ``?``, closing quotes and brackets aside."""
    return text.rstrip().rstrip("\"')]").endswith((".", "!", "?"))


# --------------------------------------------------------------------------- reading
def load_run_tasks(scenarios):
    """The task set a run was simulated from (``scenarios``: ``"embedded"``, ``"sotopia"`` or a folder; nothing is
    downloaded): ``(TaskSet, "")``, or ``(None, why)``: ``"unnamed"``, ``"not-fetched"`` or the error's type name."""
    if not scenarios:
        return None, "unnamed"
    if scenarios in datasets.TASK_SETS and not datasets.is_cached(datasets.TASK_SETS[scenarios]):
        return None, "not-fetched"
    try:
        return load_tasks(scenarios), ""
    except (ScenarioError, OSError, ValueError) as exc:
        return None, type(exc).__name__


def _str(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


def _int_or_none(x) -> int | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return int(v) if math.isfinite(v) else None


def _coord(ds, name, n, default) -> list:
    """A per-episode coordinate as a list, or ``default(i)`` for each episode where the cube lacks it."""
    if name in ds.variables and ds[name].dims == ("episode",):
        return np.asarray(ds[name].values).tolist()
    return [default(i) for i in range(n)]


def _arr(ds, name, dims):
    """Variable ``name`` with ``dims`` first, as numpy; ``None`` where the cube lacks it or those dims."""
    if name not in ds.variables or not set(dims) <= set(ds[name].dims):
        return None
    return np.asarray(ds[name].transpose(*dims, ...).values)


def _argmax(row, words):
    """The most probable word of a distribution and its probability; ``(None, None)`` where none is finite."""
    row = np.asarray([] if row is None else row, dtype=float)
    if not np.isfinite(row).any():
        return None, None
    i = int(np.nanargmax(row))
    return str(words[i]), float(row[i])


def _limit(ds, default: int | None) -> int | None:
    """The cube's utterance limit (attribute ``max_utterances``), else ``default``."""
    own = _int_or_none(ds.attrs.get("max_utterances"))
    return own if own is not None else default


def _judge_index(table) -> dict:
    """``{(task_index, sim_seed): (scores, judge name)}``, scores by agent, then in the rubric's dimension order."""
    if table is None or len(table) == 0:
        return {}
    # lazy: pandas (through synclib.judge) only where a judge table is read
    from synclib.judge import DIMENSIONS

    order = {d: i for i, d in enumerate(DIMENSIONS)}
    out = {}
    key = "task_index" if "task_index" in table.columns else "episode"
    for (ti, seed), sub in table.groupby([key, "sim_seed"], sort=False):
        sub = sub.assign(_d=sub["dimension"].map(lambda d: order.get(d, len(order)))).sort_values(
            ["agent", "_d"], kind="stable")
        rows = tuple(Score(agent=int(r.agent), agent_name=_str(getattr(r, "agent_name", "")),
                           dimension=_str(r.dimension), score=_int_or_none(r.score),
                           reasoning=_str(getattr(r, "reasoning", "")).strip(),
                           error=_str(getattr(r, "error", "")).strip()) for r in sub.itertuples(index=False))
        judges = sorted({_str(j) for j in sub["judge"]} - {""}) if "judge" in sub.columns else []
        out[(int(ti), int(seed))] = (rows, ", ".join(judges))
    return out


def _transcript(view, texts_a, texts_b, n, names, max_utt, task, tom=None) -> Transcript:
    """The first ``n`` stored utterances (never beyond the stored rounds); ``tom``: the ToM read-outs of
    this dialog (``emotion``, ``action``, ``format`` per speaker, and the candidate words)."""
    n = min(n, len(texts_a) + len(texts_b))
    utts = [_str((texts_a if t % 2 == 0 else texts_b)[t // 2]) for t in range(n)]
    turns = []
    for t, text in enumerate(utts):
        kw = {}
        if tom is not None:
            side, k = t % 2, t // 2
            emo, act, fmt = tom["emotion"][side], tom["action"][side], tom["format"][side]
            kw["emotion"], kw["emotion_p"] = _argmax(None if emo is None else emo[k], tom["emotion_words"])
            kw["action"], kw["action_p"] = _argmax(None if act is None else act[k], tom["action_words"])
            f = None if fmt is None else _int_or_none(fmt[k])
            kw["tom_format"] = f if f in (0, 1) else None
        turns.append(Turn(index=t, agent=t % 2 + 1, speaker=names[t % 2], text=text, **kw))
    return Transcript(view=view, turns=tuple(turns), end=end_reason(utts, max_utt, task=task, names=names))


def _tom_arrays(ds, dims) -> dict | None:
    """The cube's ToM dialogs: texts, utterance counts, both speakers' emotion and action distributions
    and format flags (``None`` where missing), the candidate words; ``None`` without ToM dialogs."""
    if not all(v in ds.variables for v in ("text_a_tom", "text_b_tom", "n_utterances_tom")):
        return None
    return {"text": {s: _arr(ds, f"text_{s}_tom", dims) for s in "ab"},
            "n": _arr(ds, "n_utterances_tom", ("episode", "sim_seed")),
            "emotion": [_arr(ds, f"emotion_{s}", dims + ("emotion",)) for s in "ab"],
            "action": [_arr(ds, f"action_{s}", dims + ("action",)) for s in "ab"],
            "format": [_arr(ds, f"tom_format_{s}", dims) for s in "ab"],
            "emotion_words": np.asarray(ds["emotion"].values).tolist() if "emotion" in ds.coords else list(EMOTIONS),
            "action_words": np.asarray(ds["action"].values).tolist() if "action" in ds.coords else list(ACTIONS)}


def _tom_transcript(tom, e, s, names, max_utt, task) -> Transcript | None:
    """The ToM dialog of episode row ``e`` and seed column ``s``, or ``None`` where there is none."""
    nt = _int_or_none(tom["n"][e, s]) if tom is not None else None
    if nt is None or nt < 0:  # -1: no ToM dialog for this unit (simulate.tom_episodes)
        return None
    info = {k: [None if x is None else x[e, s] for x in tom[k]] for k in ("emotion", "action", "format")}
    info.update(emotion_words=tom["emotion_words"], action_words=tom["action_words"])
    return _transcript("tom", tom["text"]["a"][e, s], tom["text"]["b"][e, s], nt, names, max_utt, task, tom=info)


def dialogs_from_cube(cube, *, run: str = "run", pair: str | None = None, order: int = 1, model_a: str = "",
                      model_b: str = "", family: str = "", tasks=None, judge=None,
                      max_utterances: int | None = None) -> list[Dialog]:
    """Every dialog of one cube (a ``Dataset`` or a path; only small variables are read), episode then seed.
    ``run`` ... ``family`` name the run as the manifest does (``model_a``, ``model_b`` default to the cube's
    attributes); ``tasks``: the cube's task set (names, goals, scenario, exact LEAVE rule); ``judge``: the run's
    judge table (:func:`synclib.judge.read_table`); ``max_utterances``: the limit if the cube has no attribute."""
    import xarray as xr

    if not isinstance(cube, xr.Dataset):
        with xr.open_dataset(cube) as opened:
            try:
                return dialogs_from_cube(opened, run=run, pair=pair, order=order, model_a=model_a, model_b=model_b,
                                         family=family, tasks=tasks, judge=judge, max_utterances=max_utterances)
            except ValueError as exc:
                raise ValueError(f"{cube}: {exc}") from None
    ds = cube
    for v in ("text_a", "text_b", "n_utterances"):
        if v not in ds.variables:
            raise ValueError(f"variable {v!r} is missing from the cube")
    E = ds.sizes["episode"]
    episodes = _coord(ds, "episode", E, lambda i: i)
    seeds = np.asarray(ds["sim_seed"].values).tolist() if "sim_seed" in ds.coords else list(range(ds.sizes["sim_seed"]))
    col = {c: _coord(ds, c, E, lambda i: "") for c in ("env_id", "codename", "source", "agent1_id", "agent2_id")}
    task_index = _coord(ds, "task_index", E, lambda i: episodes[i])
    relationship = _coord(ds, "relationship", E, lambda i: None)
    cube_names = [_coord(ds, f"agent{k}_name", E, lambda i, k=k: f"agent {k}") for k in (1, 2)]
    max_utt = _limit(ds, max_utterances)
    dims = ("episode", "sim_seed", "round")
    text = {s: _arr(ds, f"text_{s}", dims) for s in "ab"}
    n_utt = _arr(ds, "n_utterances", ("episode", "sim_seed"))
    tom = _tom_arrays(ds, dims)
    reader = _arr(ds, "passive_reader", ("episode", "sim_seed"))
    by_index = {int(t.index): t for t in tasks} if tasks is not None else {}
    personas = getattr(tasks, "personas", {}) if tasks is not None else {}
    judged = _judge_index(judge)
    model_a, model_b = model_a or _str(ds.attrs.get("model_a", "")), model_b or _str(ds.attrs.get("model_b", ""))
    out = []
    for e in range(E):
        ti = int(task_index[e])
        task = by_index.get(ti)
        env_id, a1, a2 = (_str(col[c][e]) for c in ("env_id", "agent1_id", "agent2_id"))
        if task is not None and not ((not env_id or task.env.pk == env_id) and (not a1 or task.agents[0].pk == a1)
                                     and (not a2 or task.agents[1].pk == a2)):
            task = None  # the task set's task is not the one the cube played
        names = tuple(task.names) if task is not None else (_str(cube_names[0][e]), _str(cube_names[1][e]))
        rel = _int_or_none(relationship[e])
        for s, seed in enumerate(seeds):
            rd_id = _str(reader[e, s]) if reader is not None else ""
            scores, judge_name = judged.get((ti, int(seed)), ((), ""))
            out.append(Dialog(
                run=run, pair=pair or run, order=int(order), model_a=model_a, model_b=model_b, family=family,
                episode=int(episodes[e]), task_index=ti, sim_seed=int(seed),
                codename=_str(col["codename"][e]) or (task.codename if task is not None else ""),
                source=_str(col["source"][e]), relationship=RELATIONSHIPS.get(rel, str(rel)) if rel is not None else "",
                scenario=render_text(task.env.scenario) if task is not None else None, names=names,
                goals=tuple(render_text(g) for g in task.env.agent_goals) if task is not None else None,
                max_utterances=max_utt,
                genuine=_transcript("genuine", text["a"][e, s], text["b"][e, s], max(_int_or_none(n_utt[e, s]) or 0, 0),
                                    names, max_utt, task),
                tom=_tom_transcript(tom, e, s, names, max_utt, task), scores=scores, judge=judge_name,
                passive_reader=f"{personas[rd_id].name} ({rd_id})" if rd_id in personas else rd_id,
                has_judge_table=judge is not None, passive_reader_id=rd_id))
    return out


def _count(dialogs) -> dict:
    c = dict.fromkeys(("dialogs", "leave", "limit", "other", "judged", "tom", "tom_leave", "tom_limit", "tom_other",
                       "utterances", "mid_sentence"), 0)
    for d in dialogs:
        c["dialogs"] += 1
        c[d.genuine.end] += 1
        c["utterances"] += d.genuine.n_utterances
        c["mid_sentence"] += sum(not ends_a_sentence(t.text) for t in d.genuine.turns)
        c["judged"] += bool(d.scores)
        if d.tom is not None:
            c["tom"] += 1
            c[f"tom_{d.tom.end}"] += 1
    return c


def _cap(value) -> int | None:
    """``max_dialogs_per_run`` as an int or ``None`` (papermill's ``-p`` passes strings)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "all")):
        return None
    try:
        cap = int(value)
    except (TypeError, ValueError):
        cap = -1
    if cap < 0 or (not isinstance(value, str) and cap != value):
        raise ValueError(f"max_dialogs_per_run must be a whole number >= 0 or None, got {value!r}")
    return cap


def collect_dialogs(results, max_dialogs_per_run: int | None = 12, runs=None) -> DialogSet:
    """The dialogs of every ordered run (or of ``runs``) of ``results`` (a ``Results`` or a directory), at most
    ``max_dialogs_per_run`` per run (``None``, ``"None"``: all), judged ones first, in cube order; counts cover all."""
    # lazy: xarray (through synclib.analysis.results) only when a results directory is read
    from synclib.analysis.results import Results, load_results

    res = results if isinstance(results, Results) else load_results(results)
    cap = _cap(max_dialogs_per_run)
    cfg = res.config
    tasks, why = load_run_tasks(cfg.get("scenarios"))
    by_index = {int(t.index) for t in tasks} if tasks is not None else set()
    sim = cfg.get("simulate") or {}
    kept, everything, infos = [], [], []
    for name in (list(runs) if runs is not None else res.run_names):
        r = res.run(name)
        info = RunDialogs(name=r.name, pair=r.pair, order=r.order, model_a=r.model_a, model_b=r.model_b,
                          family=r.family, has_judge_table=res.judge(r.name) is not None,
                          has_cube=r.cube is not None and r.cube.is_file())
        infos.append(info)
        if not info.has_cube:
            continue
        ds = open_cube(r.cube)
        try:
            info.max_utterances = _limit(ds, _int_or_none(sim.get("max_utterances")))
            dialogs = dialogs_from_cube(ds, run=r.name, pair=r.pair, order=r.order, model_a=r.model_a,
                                        model_b=r.model_b, family=r.family, tasks=tasks, judge=res.judge(r.name),
                                        max_utterances=info.max_utterances)
        finally:
            ds.close()
        if tasks is not None:
            played = {d.task_index for d in dialogs}
            info.mismatched_tasks = sorted({d.task_index for d in dialogs if d.goals is None} & by_index)
            info.missing_tasks = sorted(played - by_index)
        first = [d for d in dialogs if d.scores] + [d for d in dialogs if not d.scores]
        shown = first if cap is None else first[:cap]
        info.total, info.shown, info.counts = len(dialogs), len(shown), _count(dialogs)
        info.left_out = sorted((d.episode, d.sim_seed) for d in first[len(shown):])
        kept += shown
        everything += dialogs
    return DialogSet(dialogs=kept, runs=infos, counts=_count(everything), name=str(res.manifest.get("name", "")),
                     embedded=res.embedded, synthetic=res.synthetic, max_dialogs_per_run=cap,
                     judge_sample=_int_or_none((cfg.get("judge") or {}).get("sample")),
                     reply_cap={"max_new_tokens": sim["max_new_tokens"], "reply_end": sim.get("reply_end", "line")}
                     if sim.get("max_new_tokens") else None,
                     scenarios=cfg.get("scenarios"), tasks=tasks, tasks_missing=why)


# --------------------------------------------------------------------------- the prompts of one turn
@dataclass(frozen=True)
class ViewPrompt:
    """One view's prompt (``"active"``, ``"passive"`` or ``"tom"``) in :func:`synclib.tasks.prompts.masked_prompt`'s
    parts; ``parts`` is ``None`` where the turn has no such prompt (the ToM dialog did not reach it)."""

    view: str
    parts: tuple | None

    @property
    def text(self) -> str | None:
        """The prompt exactly as :func:`synclib.tasks.prompts.render_prompt` returns it."""
        return None if self.parts is None else "".join(p.text for p in self.parts)

    @property
    def masked(self) -> tuple:
        """The parts the masking removed or replaced."""
        return () if self.parts is None else tuple(p for p in self.parts if p.kind != "shown")


@dataclass(frozen=True)
class TurnPrompts:
    """The three prompts (``views``: active, passive, tom) before utterance ``turn`` of a dialog on task
    ``task_index``, seed ``sim_seed``, agent ``agent`` (0 or 1) speaking.  ``reader``: the passive reader's persona
    (``None``: told it is the agent it replaces); ``drawn``: :func:`synclib.tasks.prompts.passive_persona`'s
    (``None`` without a task set); ``dialog``: the run's dialog of the turn (``None``: not from a run)."""

    task_index: int
    codename: str
    names: tuple
    agent: int
    turn: int
    sim_seed: int
    reader: object
    drawn: object
    views: tuple
    dialog: Dialog | None = None

    def view(self, name: str) -> ViewPrompt:
        return next(v for v in self.views if v.view == name)


def turn_prompts(task, agent: int, history: Sequence[str], sim_seed: int, taskset=None, *,
                 tom_history: Sequence[str] | None = None, reader=None) -> TurnPrompts:
    """The speaker's, the passive reader's and the ToM dialog's prompts before utterance ``len(history)`` of
    ``task``, agent ``agent`` (0 or 1) speaking, as the simulator renders them.  ``history``: the genuine dialog's
    utterances so far, ``tom_history`` the ToM dialog's (``None``: ToM prompt at turn 0 only); ``reader``: a persona
    or a persona id of ``taskset``, by default the one drawn from ``taskset``, else the replaced agent."""
    history = list(history)
    t = len(history)
    if isinstance(reader, str):
        reader = taskset.personas[reader]
    drawn = passive_persona(taskset, task.index, sim_seed) if taskset is not None else None
    reader = drawn if reader is None else reader
    if tom_history is None and t == 0:
        tom_history = []
    tom = (masked_prompt(task, agent, list(tom_history), "tom")
           if tom_history is not None and len(tom_history) == t else None)
    views = (ViewPrompt("active", masked_prompt(task, agent, history, "active")),
             ViewPrompt("passive", masked_prompt(task, agent, history, "passive", reader)), ViewPrompt("tom", tom))
    return TurnPrompts(task_index=int(task.index), codename=task.codename, names=tuple(task.names), agent=agent,
                       turn=t, sim_seed=int(sim_seed), reader=reader, drawn=drawn, views=views)


def _pick_turn(d: Dialog, turn: int | None) -> int | None:
    """``turn``, or the latest of 3, 2, 1, 0 that the dialog and its ToM dialog (where it has one) reached."""
    n_tom = d.tom.n_utterances if d.tom is not None else None
    for t in [turn] if turn is not None else [3, 2, 1, 0]:
        if 0 <= t < d.genuine.n_utterances and (n_tom is None or t < n_tom):
            return t
    return None


def dialog_turn_prompts(found: DialogSet, tasks, *, run: str | None = None, episode: int | None = None,
                        seed: int | None = None, turn: int | None = None) -> TurnPrompts | None:
    """The prompts (:func:`turn_prompts`) of one turn of a dialog of ``found`` whose texts match ``tasks``, chosen
    by ``run``, ``episode``, ``seed``, ``turn``, else the first in cube order, preferring one the passive reader
    re-read and with a ToM dialog, at turn 3 (else 2, 1, 0).  ``None`` when no dialog fits."""
    if tasks is None:
        return None
    by_index = {int(t.index): t for t in tasks}
    fits = [d for d in found.dialogs
            if d.goals is not None and d.task_index in by_index and tuple(by_index[d.task_index].names) == d.names
            and run in (None, d.run) and episode in (None, d.episode) and seed in (None, d.sim_seed)
            and _pick_turn(d, turn) is not None]
    if not fits:
        return None
    d = min(fits, key=lambda d: (not d.passive_reader_id, d.tom is None))
    t = _pick_turn(d, turn)
    reader = d.passive_reader_id if d.passive_reader_id in getattr(tasks, "personas", {}) else None
    tp = turn_prompts(by_index[d.task_index], t % 2, [x.text for x in d.genuine.turns[:t]], d.sim_seed, tasks,
                      tom_history=[x.text for x in d.tom.turns[:t]] if d.tom is not None else None, reader=reader)
    return replace(tp, dialog=d)
