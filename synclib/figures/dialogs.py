"""The dialogs page: every dialog of the run, how it ended, the judge's scores, and what the models read at one turn.

The notebook ``notebooks/dialogs.md`` draws this page from the functions here; "What the models
read" is :func:`prompts_section`, its prompts built by :mod:`synclib.figures.dialog_prompts`.

:func:`collect_dialogs` gathers, for every ordered run of a results directory, each dialog
(one episode and simulation seed of the run's cube):

* the task: scenario, relationship, source, both agents' names and goals (the task files'
  text with Sotopia's tags removed by :func:`synclib.tasks.prompts.render_text`, as the judge
  sees them); the task files are the ones the results manifest's config names
  (``scenarios``), matched to the cube's episodes by task index, scenario id and agent ids;
* every turn as stored in the cube (``text_a`` / ``text_b``: utterance ``2k`` is
  ``text_a[..., k]``, ``2k+1`` is ``text_b[..., k]``, ``n_utterances`` of them).  The cube
  keeps the reply *after* the protocol's post-processing
  (:func:`synclib.tasks.prompts.postprocess_reply`: first line only, text before the first
  ``": "`` dropped); the raw generation is not stored, so it cannot be shown;
* where and why it ended (:func:`end_reason`): ``"leave"`` when the last utterance ends the
  episode by the LEAVE rule (:func:`synclib.tasks.prompts.is_leave` on the complete dialog line),
  ``"limit"`` when it reached ``max_utterances`` (the cube's attribute), ``"other"``
  otherwise (the stored texts do not explain the end, e.g. synthetic test data);
* the judge's scores per agent and dimension, with its reasoning where it gave one (the
  run's judge table, matched on task index and seed; dialogs outside the config's
  ``judge.sample`` have none);
* when the cube has the Theory-of-Mind run (a *separate* dialog on the same task and seed,
  with the emotion / action instruction): its turns as stored (``text_*_tom``) and, per
  turn, the most probable emotion word and action type with their probabilities
  (``emotion_*`` / ``action_*``: the distributions over the 8 emotion and 5 action words
  where the speaker generates them) and whether the reply followed the instructed format
  (``tom_format_*``).

:func:`render_html` turns a :class:`DialogSet` into one self-contained HTML fragment (inline
CSS and a small inline script, no network): ``<select>`` filters for the run (or both runs
of a pair), the episode and the seed, and previous / next buttons.  Every dialog is a
``<details>`` element, so without JavaScript all of them are listed and readable; the script
only filters (it marks the widget ``data-sdlg-ready="1"`` when it has run, or sets
``data-sdlg-error``).  Texts are HTML-escaped and shown verbatim (``white-space: pre-wrap``).
The widget never exceeds its column: ``max-width: 100%``, words wrap anywhere, tables are
fixed-layout at 100 %.  Its size is bounded by ``max_dialogs_per_run`` (the first dialogs of
each run in cube order: episode, then seed; the widget says which were left out).

:func:`summary_sentence` counts the dialogs and how they ended; :func:`source_note` says
whose dialogs these are (embedded tiny models, configured models or synthetic test data).
"""
from __future__ import annotations

import hashlib
import html
import json
import math
import re
from dataclasses import dataclass, field

import numpy as np

from synclib.cube import open_cube
from synclib.figures import dialog_prompts as prompts
from synclib.figures.dialog_prompts import visible_html
from synclib.tasks import datasets
from synclib.tasks.prompts import ACTIONS, EMOTIONS, is_leave, is_leave_line, render_text, speaker_line
from synclib.tasks.scenarios import RELATIONSHIPS, ScenarioError, load_tasks

__all__ = ["END_REASONS", "Turn", "Transcript", "Score", "Dialog", "RunDialogs", "DialogSet",
           "end_reason", "load_run_tasks", "dialogs_from_cube", "collect_dialogs", "render_html",
           "summary_sentence", "source_note", "prompts_section"]

#: how a dialog can end (see :func:`end_reason`)
END_REASONS = ("leave", "limit", "other")
_END_LABEL = {"leave": "ended by LEAVE", "limit": "ended at the utterance limit", "other": "end not explained"}


# --------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Turn:
    """One utterance as stored in the cube.

    ``index`` is the utterance index ``t`` (0-based, the ``Turn t`` of the prompts); agent
    ``index % 2 + 1`` speaks.  The ToM fields are set only for the ToM run: the most
    probable emotion word / action type and their probabilities (``None`` where the cube
    holds NaN, e.g. no action read-out because no ``.`` came early enough) and
    ``tom_format`` (1: the reply opened with an emotion then an action word, 0: not,
    ``None``: not recorded).
    """

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
    """The turns of one dialog run (``view``: ``"genuine"`` or ``"tom"``) and how it ended."""

    view: str
    turns: tuple[Turn, ...]
    end: str
    end_detail: str

    @property
    def n_utterances(self) -> int:
        return len(self.turns)


@dataclass(frozen=True)
class Score:
    """One judge row: ``agent`` (1 or 2) on ``dimension``; ``score`` ``None`` when missing."""

    agent: int
    agent_name: str
    dimension: str
    score: int | None
    reasoning: str = ""
    error: str = ""


@dataclass(frozen=True)
class Dialog:
    """One dialog of an ordered run: task, genuine transcript, ToM transcript, judge scores."""

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
    """What one ordered run contributed: ``total`` dialogs in its cube, ``shown`` kept,
    ``left_out`` the (episode, seed) of the others; ``notes`` about missing pieces."""

    name: str
    pair: str
    order: int
    model_a: str
    model_b: str
    family: str
    total: int = 0
    shown: int = 0
    left_out: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    counts: dict = field(default_factory=dict)


@dataclass
class DialogSet:
    """The dialogs of a results directory (:func:`collect_dialogs`).

    ``dialogs`` are the ones kept (at most ``max_dialogs_per_run`` per run); ``runs`` has one
    :class:`RunDialogs` per ordered run; ``counts`` counts *all* dialogs of the cubes
    (``dialogs``, ``leave``, ``limit``, ``other``, ``judged``, ``tom``, ``tom_leave``,
    ``tom_limit``, ``tom_other``); ``notes`` are page-level remarks (e.g. task texts missing).
    """

    dialogs: list
    runs: list
    counts: dict
    notes: list = field(default_factory=list)
    name: str = ""
    embedded: bool = False
    synthetic: bool = False
    max_dialogs_per_run: int | None = None
    judge_sample: int | None = None
    reply_cap: dict | None = None   # the config's simulate.max_new_tokens and reply_end


# --------------------------------------------------------------------------- rules
def end_reason(utterances, max_utterances: int | None, task=None, names=None) -> tuple[str, str]:
    """Why a dialog of ``utterances`` (in order, as stored) ended.

    Parameters
    ----------
    utterances : sequence of str
    max_utterances : the run's limit (``None``: unknown)
    task : synclib.tasks.scenarios.Task, optional
        With it the LEAVE rule is :func:`synclib.tasks.prompts.is_leave` ``(last, task, turn)``,
        exactly the simulator's; else with ``names`` (agent 1's, agent 2's) the same rule on
        the same dialog line (:func:`synclib.tasks.prompts.speaker_line`); else the rule without
        the line (:func:`synclib.tasks.prompts.is_leave` on the utterance alone).

    Returns
    -------
    (reason, detail)
        ``reason`` is ``"leave"`` (the last utterance meets the LEAVE rule; also when the
        limit was reached at the same utterance, since the rule ended the episode there
        anyway), ``"limit"`` (``len(utterances) >= max_utterances``) or ``"other"``;
        ``detail`` is one sentence for readers.
    """
    n = len(utterances)
    if n == 0:
        return "other", "No utterance is stored for this dialog."
    t, last = n - 1, str(utterances[-1])
    if task is not None:
        leave = is_leave(last, task, t)
    elif names is not None:
        leave = is_leave_line(speaker_line(tuple(names), t, last))
    else:
        leave = is_leave(last)
    at_limit = max_utterances is not None and n >= max_utterances
    if leave:
        also = f" It was also the last allowed utterance ({max_utterances})." if at_limit else ""
        return "leave", (f"By the LEAVE rule: utterance {t} has \"left\" or \"leave\" within the first or last "
                         f"10 characters of its dialog line, which closes the episode.{also}")
    if at_limit:
        return "limit", f"At the utterance limit: {n} of {max_utterances} utterances, nobody left."
    limit = f"at most {max_utterances}" if max_utterances is not None else "an unknown limit"
    return "other", (f"After {n} utterances ({limit}), although the last one does not meet the LEAVE rule: "
                     "the stored texts do not explain the end (e.g. synthetic test data, or a cube written "
                     "under other rules).")


# --------------------------------------------------------------------------- reading
def load_run_tasks(scenarios):
    """The task set a run was simulated from, or ``None`` with the reason.

    Parameters
    ----------
    scenarios : the results manifest config's ``scenarios`` (``"embedded"``, ``"sotopia"`` or a
        folder); a page never downloads: ``"sotopia"`` is read only where it is fetched

    Returns
    -------
    (TaskSet or None, note)
        ``note`` is ``""`` when the tasks loaded.
    """
    if not scenarios:
        return None, "The results manifest names no scenario set, so the goals cannot be shown."
    if scenarios in datasets.TASK_SETS and not datasets.is_cached(datasets.TASK_SETS[scenarios]):
        return None, (f"The `{scenarios}` tasks are not fetched on this machine (`synclib fetch {scenarios}`), "
                      "so names come from the cubes and goals are not shown.")
    try:
        return load_tasks(scenarios), ""
    except (ScenarioError, OSError, ValueError) as exc:
        return None, (f"The scenario set `{scenarios}` could not be read here ({type(exc).__name__}), so "
                      "names come from the cubes and goals are not shown.")


def _str(x) -> str:
    if x is None:
        return ""
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    if isinstance(x, float) and math.isnan(x):
        return ""
    return str(x)


def _int_or_none(x) -> int | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return int(v) if math.isfinite(v) else None


def _coord(ds, name, n, default):
    if name in ds.variables and ds[name].dims == ("episode",):
        return [v for v in np.asarray(ds[name].values).tolist()]
    return [default(i) for i in range(n)]


def _arr(ds, name, dims):
    if name not in ds.variables:
        return None
    da = ds[name]
    if not set(dims) <= set(da.dims):
        return None
    rest = [d for d in da.dims if d not in dims]
    return np.asarray(da.transpose(*dims, *rest).values)


def _argmax(row, words):
    if row is None:
        return None, None
    row = np.asarray(row, dtype=float)
    if row.size == 0 or not np.isfinite(row).any():
        return None, None
    i = int(np.nanargmax(row))
    return str(words[i]), float(row[i])


def _task_matches(task, env_id, a1, a2) -> bool:
    return ((not env_id or task.env.pk == env_id)
            and (not a1 or task.agents[0].pk == a1) and (not a2 or task.agents[1].pk == a2))


def _judge_index(table):
    """``{(task_index, sim_seed): (rows, judge name)}`` of a judge table."""
    if table is None or len(table) == 0:
        return {}
    # lazy: pandas (through synclib.judge) only where a judge table is read
    from synclib.judge import DIMENSIONS

    order = {d: i for i, d in enumerate(DIMENSIONS)}
    key_col = "task_index" if "task_index" in table.columns else "episode"
    out = {}
    for (ti, seed), sub in table.groupby([key_col, "sim_seed"], sort=False):
        sub = sub.assign(_d=sub["dimension"].map(lambda d: order.get(d, len(order))))
        sub = sub.sort_values(["agent", "_d"], kind="stable")
        rows = []
        for r in sub.itertuples(index=False):
            rows.append(Score(agent=int(r.agent), agent_name=_str(getattr(r, "agent_name", "")),
                              dimension=_str(r.dimension), score=_int_or_none(r.score),
                              reasoning=_str(getattr(r, "reasoning", "")).strip(),
                              error=_str(getattr(r, "error", "")).strip()))
        judges = sorted({_str(j) for j in sub["judge"]} - {""}) if "judge" in sub.columns else []
        out[(int(ti), int(seed))] = (tuple(rows), ", ".join(judges))
    return out


def _transcript(view, texts_a, texts_b, n, names, max_utt, task, tom=None) -> Transcript:
    n = min(n, len(texts_a) + len(texts_b))  # never beyond the stored rounds
    utts = [_str((texts_a if t % 2 == 0 else texts_b)[t // 2]) for t in range(n)]
    turns = []
    for t, text in enumerate(utts):
        kw = {}
        if tom is not None:
            side = t % 2
            emo = tom["emotion"][side]
            act = tom["action"][side]
            fmt = tom["format"][side]
            kw["emotion"], kw["emotion_p"] = _argmax(None if emo is None else emo[t // 2], tom["emotion_words"])
            kw["action"], kw["action_p"] = _argmax(None if act is None else act[t // 2], tom["action_words"])
            f = None if fmt is None else _int_or_none(fmt[t // 2])
            kw["tom_format"] = f if f in (0, 1) else None
        turns.append(Turn(index=t, agent=t % 2 + 1, speaker=names[t % 2], text=text, **kw))
    end, detail = end_reason(utts, max_utt, task=task, names=names)
    return Transcript(view=view, turns=tuple(turns), end=end, end_detail=detail)


def _task_columns(ds, n, episodes) -> dict:
    """The cube's per-episode coordinates that name each episode's task (task index, scenario
    id, codename, source, relationship, both agents' ids and names): lists of ``n``, with a
    default where the cube lacks the coordinate (the task index defaults to ``episodes``)."""
    return {"task_index": _coord(ds, "task_index", n, lambda i: episodes[i]),
            "env_id": _coord(ds, "env_id", n, lambda i: ""),
            "codename": _coord(ds, "codename", n, lambda i: ""),
            "source": _coord(ds, "source", n, lambda i: ""),
            "relationship": _coord(ds, "relationship", n, lambda i: None),
            "ids": [_coord(ds, f"agent{k}_id", n, lambda i: "") for k in (1, 2)],
            "names": [_coord(ds, f"agent{k}_name", n, lambda i, k=k: f"agent {k}") for k in (1, 2)]}


def _tom_arrays(ds, dims) -> dict | None:
    """The cube's Theory-of-Mind run: its texts and utterance counts, both speakers' emotion and
    action distributions and format flags (``None`` where missing) and the candidate words;
    ``None`` when the cube has no ToM run."""
    if not all(v in ds.variables for v in ("text_a_tom", "text_b_tom", "n_utterances_tom")):
        return None
    return {"text": {s: _arr(ds, f"text_{s}_tom", dims) for s in "ab"},
            "n": _arr(ds, "n_utterances_tom", ("episode", "sim_seed")),
            "emotion": [_arr(ds, f"emotion_{s}", dims + ("emotion",)) for s in "ab"],
            "action": [_arr(ds, f"action_{s}", dims + ("action",)) for s in "ab"],
            "format": [_arr(ds, f"tom_format_{s}", dims) for s in "ab"],
            "emotion_words": (np.asarray(ds["emotion"].values).tolist() if "emotion" in ds.coords
                              else list(EMOTIONS)),
            "action_words": (np.asarray(ds["action"].values).tolist() if "action" in ds.coords
                             else list(ACTIONS))}


def _tom_transcript(tom, e, s, names, max_utt, task) -> Transcript | None:
    """The ToM dialog of episode row ``e`` and seed column ``s`` with its read-outs per turn
    (``tom`` from :func:`_tom_arrays`), or ``None`` where the cube has none."""
    nt = _int_or_none(tom["n"][e, s]) if tom is not None else None
    if nt is None or nt < 0:  # -1: no ToM dialog for this unit (simulate.tom_episodes)
        return None
    info = {k: [None if x is None else x[e, s] for x in tom[k]] for k in ("emotion", "action", "format")}
    info.update(emotion_words=tom["emotion_words"], action_words=tom["action_words"])
    return _transcript("tom", tom["text"]["a"][e, s], tom["text"]["b"][e, s], max(nt, 0), names,
                       max_utt, task, tom=info)


def _task_texts(task) -> tuple:
    """A task's scenario and both goals as the judge sees them; ``(None, None)`` without a task."""
    if task is None:
        return None, None

    return render_text(task.env.scenario), tuple(render_text(g) for g in task.env.agent_goals)


def _cube_notes(tasks, mismatched, dialogs, by_index, max_utt) -> list[str]:
    """What a cube's dialogs are shown without: goals of tasks that do not match the cube's ids
    (``mismatched``) or are not in the task set, and the utterance limit."""
    notes = []
    if tasks is not None and mismatched:
        notes.append(f"Task(s) {', '.join(map(str, sorted(set(mismatched))))} of the scenario set do not "
                     "match the cube's scenario / agent ids: shown without goals.")
    missing = sorted({d.task_index for d in dialogs} - set(by_index)) if tasks is not None else []
    if missing:
        notes.append(f"Task(s) {', '.join(map(str, missing))} are not in the scenario set: shown without goals.")
    if max_utt is None:
        notes.append("The cube records no utterance limit (attribute max_utterances).")
    return notes


def dialogs_from_cube(cube, *, run: str = "run", pair: str | None = None, order: int = 1,
                      model_a: str = "", model_b: str = "", family: str = "", tasks=None,
                      judge=None, max_utterances: int | None = None) -> tuple[list, list]:
    """Every dialog of one cube.

    Parameters
    ----------
    cube : xarray.Dataset or path
        A cube (book/architecture.md); only its small variables are read.
    run, pair, order, model_a, model_b, family : the run's identity (as the manifest has it;
        ``model_a`` / ``model_b`` default to the cube's attributes)
    tasks : TaskSet, optional
        The task set the cube was simulated from (names, goals, scenario, the exact LEAVE
        rule); episodes whose task does not match the cube's ids are shown without it.
    judge : DataFrame, optional
        The run's judge table (:func:`synclib.judge.read_table`).
    max_utterances : the limit when the cube has no ``max_utterances`` attribute

    Returns
    -------
    (dialogs, notes)
        :class:`Dialog` objects in cube order (episode, then seed) and notes about what was
        missing.
    """
    import xarray as xr

    if not isinstance(cube, xr.Dataset):
        with xr.open_dataset(cube) as opened:
            try:
                return dialogs_from_cube(opened, run=run, pair=pair, order=order, model_a=model_a,
                                         model_b=model_b, family=family, tasks=tasks, judge=judge,
                                         max_utterances=max_utterances)
            except ValueError as exc:
                raise ValueError(f"{cube}: {exc}") from None
    ds = cube
    for v in ("text_a", "text_b", "n_utterances"):
        if v not in ds.variables:
            raise ValueError(f"variable {v!r} is missing from the cube")
    E = ds.sizes["episode"]
    episodes = _coord(ds, "episode", E, lambda i: i)
    seeds = (np.asarray(ds["sim_seed"].values).tolist() if "sim_seed" in ds.coords
             else list(range(ds.sizes["sim_seed"])))
    col = _task_columns(ds, E, episodes)
    attr_max = _int_or_none(ds.attrs.get("max_utterances"))
    max_utt = attr_max if attr_max is not None else max_utterances
    dims = ("episode", "sim_seed", "round")
    text = {s: _arr(ds, f"text_{s}", dims) for s in "ab"}
    n_utt = _arr(ds, "n_utterances", ("episode", "sim_seed"))
    tom_arrays = _tom_arrays(ds, dims)
    reader = _arr(ds, "passive_reader", ("episode", "sim_seed"))
    model_a = model_a or _str(ds.attrs.get("model_a", ""))
    model_b = model_b or _str(ds.attrs.get("model_b", ""))

    by_index = {int(t.index): t for t in tasks} if tasks is not None else {}
    personas = getattr(tasks, "personas", {}) if tasks is not None else {}
    judged = _judge_index(judge)
    mismatched = []
    out = []
    for e in range(E):
        ti = int(col["task_index"][e])
        a1, a2 = _str(col["ids"][0][e]), _str(col["ids"][1][e])
        task = by_index.get(ti)
        if task is not None and not _task_matches(task, _str(col["env_id"][e]), a1, a2):
            mismatched.append(ti)
            task = None
        names = tuple(task.names) if task is not None else (_str(col["names"][0][e]), _str(col["names"][1][e]))
        rel = _int_or_none(col["relationship"][e])
        rel_name = (RELATIONSHIPS.get(rel, str(rel)) if rel is not None else "")
        scenario, goals = _task_texts(task)
        for s, seed in enumerate(seeds):
            n = _int_or_none(n_utt[e, s]) or 0
            genuine = _transcript("genuine", text["a"][e, s], text["b"][e, s], max(n, 0), names, max_utt, task)
            tom = _tom_transcript(tom_arrays, e, s, names, max_utt, task)
            scores, judge_name = judged.get((ti, int(seed)), ((), ""))
            rd = rd_id = _str(reader[e, s]) if reader is not None else ""
            if rd and rd in personas:
                rd = f"{personas[rd].name} ({rd})"
            out.append(Dialog(run=run, pair=pair or run, order=int(order), model_a=model_a, model_b=model_b,
                              family=family, episode=int(episodes[e]), task_index=ti, sim_seed=int(seed),
                              codename=_str(col["codename"][e]) or (task.codename if task is not None else ""),
                              source=_str(col["source"][e]), relationship=rel_name, scenario=scenario, names=names,
                              goals=goals, max_utterances=max_utt, genuine=genuine, tom=tom, scores=scores,
                              judge=judge_name, passive_reader=rd, has_judge_table=judge is not None,
                              passive_reader_id=rd_id))
    return out, _cube_notes(tasks, mismatched, out, by_index, max_utt)


def _count(dialogs) -> dict:
    c = {k: 0 for k in ("dialogs", "leave", "limit", "other", "judged", "tom", "tom_leave", "tom_limit",
                        "tom_other", "utterances", "mid_sentence")}
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
        raise ValueError(f"max_dialogs_per_run must be a whole number >= 0 or None, got {value!r}") from None
    if cap < 0 or (not isinstance(value, str) and cap != value):
        raise ValueError(f"max_dialogs_per_run must be a whole number >= 0 or None, got {value!r}")
    return cap


def collect_dialogs(results, max_dialogs_per_run: int | None = 12, runs=None) -> DialogSet:
    """The dialogs of every ordered run of a results directory.

    Parameters
    ----------
    results : synclib.analysis.results.Results or a results directory path
    max_dialogs_per_run : keep at most this many dialogs per run: the judged ones first, then the
        others, each in cube order (episode, then seed); ``None`` (or the string ``"None"``) keeps
        all.  Counts cover all dialogs.
    runs : run names to include (default: every run, manifest order)

    Returns
    -------
    DialogSet
    """
    # lazy: xarray (through synclib.analysis.results) only when a results directory is read
    from synclib.analysis.results import Results, load_results

    res = results if isinstance(results, Results) else load_results(results)
    cap = _cap(max_dialogs_per_run)
    cfg = res.config
    tasks, note = load_run_tasks(cfg.get("scenarios"))
    if res.synthetic:
        note = ("Synthetic test data: the 'utterances' are placeholder strings written by the test "
                "generator, the scores random numbers; there are no task texts.")
    notes = [note] if note else []
    judge_sample = _int_or_none((cfg.get("judge") or {}).get("sample"))
    sim = cfg.get("simulate") or {}
    sim_max = _int_or_none(sim.get("max_utterances"))
    wanted = list(runs) if runs is not None else res.run_names
    kept, all_dialogs, run_infos = [], [], []
    for name in wanted:
        r = res.run(name)
        info = RunDialogs(name=r.name, pair=r.pair, order=r.order, model_a=r.model_a, model_b=r.model_b,
                          family=r.family)
        run_infos.append(info)
        if r.cube is None or not r.cube.is_file():
            info.notes.append("its cube is not in the results directory")
            continue

        ds = open_cube(r.cube)
        try:
            dialogs, run_notes = dialogs_from_cube(ds, run=r.name, pair=r.pair, order=r.order,
                                                   model_a=r.model_a, model_b=r.model_b, family=r.family,
                                                   tasks=tasks, judge=res.judge(r.name), max_utterances=sim_max)
        finally:
            ds.close()
        info.notes.extend(run_notes)
        if res.judge(r.name) is None:
            info.notes.append("no judge table")
        info.total = len(dialogs)
        first = [d for d in dialogs if d.scores] + [d for d in dialogs if not d.scores]  # the judged first
        shown = first if cap is None else first[:cap]
        info.shown = len(shown)
        info.left_out = sorted((d.episode, d.sim_seed) for d in first[len(shown):])
        info.counts = _count(dialogs)
        kept.extend(shown)
        all_dialogs.extend(dialogs)
    return DialogSet(dialogs=kept, runs=run_infos, counts=_count(all_dialogs), notes=notes,
                     name=str(res.manifest.get("name", "")), embedded=res.embedded, synthetic=res.synthetic,
                     max_dialogs_per_run=cap, judge_sample=judge_sample,
                     reply_cap={"max_new_tokens": sim["max_new_tokens"], "reply_end": sim.get("reply_end", "line")}
                     if sim.get("max_new_tokens") else None)


# --------------------------------------------------------------------------- sentences
def _n(k: int, one: str, many: str | None = None) -> str:
    return f"{k} {one if k == 1 else (many or one + 's')}"


def source_note(results) -> str:
    """One sentence saying whose dialogs these are (Markdown)."""
    # lazy: xarray (through synclib.analysis.results) only when a results directory is read
    from synclib.analysis.results import Results, load_results

    res = results if isinstance(results, Results) else load_results(results)
    models = sorted({m for r in res.runs for m in (r.model_a, r.model_b)})
    if res.synthetic:
        return ("**These are not dialogs.** This results directory is synthetic test data: the turns are "
                "placeholder strings and the judge's scores random numbers, so the widget below only "
                "shows how the page works.")
    if res.embedded:
        return (f"These are the dialogs of the **embedded tiny models** ({', '.join(models)}), the default "
                "run's models: far smaller than the paper's, so expect short, often incoherent replies. "
                "They show what the method was fed, not what the paper's models said.")
    return f"These are the dialogs of the configured models ({', '.join(models)})."


def _ranges(pairs) -> str:
    """``[(episode, seed), ...]`` as a compact text."""
    by_seed = {}
    for e, s in pairs:
        by_seed.setdefault(s, []).append(e)
    parts = []
    for s, eps in sorted(by_seed.items()):
        eps = sorted(eps)
        spans, start, prev = [], eps[0], eps[0]
        for x in eps[1:] + [None]:
            if x is not None and x == prev + 1:
                prev = x
                continue
            spans.append(f"{start}" if start == prev else f"{start}–{prev}")
            if x is not None:
                start = prev = x
        parts.append(f"episodes {', '.join(spans)} of seed {s}")
    return " and ".join(parts)


def _left_out_text(ds: DialogSet) -> str:
    cut = [r for r in ds.runs if r.left_out]
    if not cut:
        return ""
    per = "; ".join(f"{r.name}: {_ranges(r.left_out)}" for r in cut)
    return (f"To keep the page small, at most {ds.max_dialogs_per_run} dialogs per run are shown "
            f"(the judged ones first, then the first in cube order); left out: {per}.")


def ends_a_sentence(text: str) -> bool:
    """Whether an utterance ends a sentence: its last character, closing quotes and brackets
    aside, is ``.``, ``!`` or ``?``."""
    return text.rstrip().rstrip("\"')]").endswith((".", "!", "?"))


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.0f} %" if n else "no"


def _cap_text(cap: dict) -> str:
    words = {"line": "kept as generated", "sentence": "a reply that reaches it is cut back to its last complete "
             "sentence where it has one"}
    return f"{cap['max_new_tokens']} new tokens; " + words.get(cap.get("reply_end", "line"), "")


def summary_sentence(ds: DialogSet) -> str:
    """The counts of a :class:`DialogSet` as Markdown: dialogs, shown, how they ended, judged."""
    c = ds.counts
    n_runs = len(ds.runs)
    shown = len(ds.dialogs)
    head = "The ordered run holds" if n_runs == 1 else f"The {n_runs} ordered runs hold"
    s = (f"{head} {_n(c['dialogs'], 'dialog')} ({_n(c['utterances'], 'utterance')}); "
         f"{shown} {'is' if shown == 1 else 'are'} shown above. {c['leave']} ended with LEAVE, "
         f"{c['limit']} at the utterance limit")
    s += f" and {c['other']} otherwise (the stored texts do not explain the end)." if c["other"] else "."
    if c["utterances"] and not ds.synthetic:
        s += (f" {_pct(c['mid_sentence'], c['utterances'])} of the utterances end without closing a sentence "
              "(no `.`, `!` or `?` at the end). The cube does not record which replies reached the token cap"
              + (f" ({_cap_text(ds.reply_cap)})" if ds.reply_cap else "")
              + ", so this share counts replies cut there together with fragments (a name, a phrase) that the "
              "model ended itself with a line break.")
    no_table = [r.name for r in ds.runs if "no judge table" in r.notes]
    if c["dialogs"] and len(no_table) < n_runs:
        s += f" The judge scored {c['judged']} of them"
        s += (f" (the run's config judges a random sample of {_n(ds.judge_sample, 'dialog')} per run)"
              if ds.judge_sample is not None else "")
        s += f"; {', '.join(no_table)} {'has' if len(no_table) == 1 else 'have'} no judge table." if no_table else "."
        s += (" Read the judge's scores beside the dialogs, not instead of them: the judge is a language model "
              "that scores what it reads, and a high believability can go to replies as thin as a single word "
              "(the *judge* page measures judges against published human ratings).")
    elif c["dialogs"]:
        s += " No run has a judge table."
    if c["tom"]:
        s += (f" The Theory-of-Mind runs (separate dialogs on the same tasks and seeds) ended {c['tom_leave']} "
              f"times with LEAVE and {c['tom_limit']} times at the limit"
              + (f", {c['tom_other']} otherwise." if c["tom_other"] else "."))
    left = _left_out_text(ds)
    return s + (" " + left if left else "")


# --------------------------------------------------------------------------- HTML
_CSS = """
#{id}{max-width:100%;box-sizing:border-box;overflow-wrap:anywhere;word-break:break-word;font-size:0.95em;line-height:1.45}
#{id} *{box-sizing:border-box;max-width:100%}
#{id} .sdlg-controls{display:flex;flex-wrap:wrap;gap:0.4em 0.8em;align-items:center;margin:0.3em 0 0.6em}
#{id} .sdlg-controls[hidden]{display:none}
#{id} .sdlg-controls label{display:inline-flex;flex-wrap:wrap;gap:0.3em;align-items:center}
#{id} select{max-width:100%;min-width:0;font:inherit}
#{id} button{font:inherit;padding:0 0.6em}
#{id} details.sdlg-dialog{border:1px solid rgba(128,128,128,0.45);border-radius:4px;margin:0.35em 0;padding:0.2em 0.6em}
#{id} details.sdlg-dialog>summary{cursor:pointer;font-weight:600}
#{id} .sdlg-meta{margin:0.3em 0}
#{id} .sdlg-goal{margin:0.2em 0 0.2em 0.8em}
#{id} ol.sdlg-turns{list-style:none;padding:0;margin:0.3em 0}
#{id} ol.sdlg-turns>li{margin:0.25em 0;padding:0.15em 0.5em;border-left:4px solid rgba(128,128,128,0.6)}
#{id} ol.sdlg-turns>li.sd-a1{border-left-color:rgba(31,119,180,0.85);background:rgba(31,119,180,0.07)}
#{id} ol.sdlg-turns>li.sd-a2{border-left-color:rgba(255,127,14,0.9);background:rgba(255,127,14,0.07)}
#{id} .sd-w{font-size:0.85em;opacity:0.8}
#{id} .sd-x{white-space:pre-wrap;font-family:inherit}
#{id} .sdlg-empty{font-style:italic;opacity:0.7}
#{id} .sd-r{font-size:0.85em;opacity:0.85}
#{id} .sdlg-end{font-style:italic;margin:0.3em 0}
#{id} table.sdlg-scores{width:100%;table-layout:fixed;border-collapse:collapse;font-size:0.9em;margin:0.3em 0}
#{id} table.sdlg-scores td,#{id} table.sdlg-scores th{border-bottom:1px solid rgba(128,128,128,0.3);
padding:0.1em 0.3em;text-align:left;vertical-align:top}
#{id} .sd-why{font-size:0.9em;margin:0.15em 0}
#{id} .sdlg-note{font-size:0.9em;opacity:0.85}
"""

_JS = """
(function(){
var root=document.getElementById({id_js});
if(!root){return;}
try{
var items=Array.prototype.slice.call(root.querySelectorAll("details.sdlg-dialog"));
var sel={};
["run","episode","seed"].forEach(function(k){sel[k]=root.querySelector("select[data-f="+k+"]");});
var count=root.querySelector(".sdlg-count");
var none=root.querySelector(".sdlg-none");
function match(d){
var r=sel.run.value;
if(r){var k=r.indexOf(":");var kind=r.slice(0,k),v=r.slice(k+1);
if(kind==="pair"&&d.getAttribute("data-pair")!==v){return false;}
if(kind==="run"&&d.getAttribute("data-run")!==v){return false;}}
if(sel.episode.value&&d.getAttribute("data-episode")!==sel.episode.value){return false;}
if(sel.seed.value&&d.getAttribute("data-seed")!==sel.seed.value){return false;}
return true;}
function update(){
var shown=[];
items.forEach(function(d){var m=match(d);d.style.display=m?"":"none";if(m){shown.push(d);}});
if(shown.length===1){shown[0].open=true;}
count.textContent=shown.length+" of "+items.length+" dialogs";
none.hidden=shown.length>0;
return shown;}
function pick(d){
sel.run.value="run:"+d.getAttribute("data-run");
sel.episode.value=d.getAttribute("data-episode");
sel.seed.value=d.getAttribute("data-seed");
update();}
function step(s){
var shown=items.filter(match);
var i=shown.length?items.indexOf(shown[s>0?shown.length-1:0]):(s>0?-1:items.length);
var j=i+s;
if(j>=0&&j<items.length){pick(items[j]);}}
["run","episode","seed"].forEach(function(k){sel[k].addEventListener("change",update);});
Array.prototype.forEach.call(root.querySelectorAll("button[data-step]"),function(b){
b.addEventListener("click",function(){step(parseInt(b.getAttribute("data-step"),10));});});
root.querySelector(".sdlg-controls").hidden=false;
if(items.length){pick(items[0]);}else{update();}
root.setAttribute("data-sdlg-ready","1");
}catch(err){root.setAttribute("data-sdlg-error",String(err&&err.message||err));}
})();
"""


def _e(x) -> str:
    return html.escape(_str(x), quote=True)


def _p(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _turns_html(tr: Transcript) -> str:
    out = ['<ol class="sdlg-turns">']
    for t in tr.turns:
        text = (f'<span class="sd-x">{visible_html(t.text)}</span>' if t.text != ""
                else '<span class="sdlg-empty">(empty after post-processing)</span>')
        tom = ""
        if tr.view == "tom":
            fmt = {1: "format ✓", 0: "format ✗"}.get(t.tom_format, "")
            emo = f"{_e(t.emotion)} {_p(t.emotion_p)}" if t.emotion else "–"
            act = f"{_e(t.action)} {_p(t.action_p)}" if t.action else "–"
            tom = f'<div class="sd-r">emotion {emo} · action {act}{" · " + fmt if fmt else ""}</div>'

        out.append(f'<li class="sd-a{t.agent}"><span class="sd-w">{t.index} · {_e(t.speaker)}:</span> '
                   f'{text}{tom}</li>')
    out.append("</ol>")
    out.append(f'<p class="sdlg-end" data-end="{tr.end}"><b>How it ended.</b> {_e(tr.end_detail)}</p>')
    return "".join(out)


def _scores_html(d: Dialog, judge_sample: int | None) -> str:
    if not d.has_judge_table:
        return '<p class="sdlg-note">This run has no judge table.</p>'
    if not d.scores:
        why = (f" (the run's config judges a random sample of {_n(judge_sample, 'dialog')} per run)"
               if judge_sample is not None else "")
        return f'<p class="sdlg-note">No judge scores for this dialog{why}.</p>'
    # lazy: pandas (through synclib.judge) only where a judge table is read
    from synclib.judge import SCORE_RANGES

    dims = list(dict.fromkeys(s.dimension for s in d.scores))
    cell = {(s.agent, s.dimension): s for s in d.scores}
    head = (f'<table class="sdlg-scores"><thead><tr><th style="width:50%">dimension (range)</th>'
            f'<th>{_e(d.names[0])}</th><th>{_e(d.names[1])}</th></tr></thead><tbody>')
    rows = []
    for dim in dims:
        rng = SCORE_RANGES.get(dim)
        rng = f" ({rng[0]} to {rng[1]})" if rng else ""
        vals = []
        for a in (1, 2):
            s = cell.get((a, dim))
            vals.append("" if s is None else ("–" if s.score is None else str(s.score)))
        rows.append(f"<tr><td>{_e(dim)}{rng}</td><td>{vals[0]}</td><td>{vals[1]}</td></tr>")
    parts = [head, "".join(rows), "</tbody></table>"]
    notes = []
    for s in d.scores:
        if s.reasoning:
            notes.append(f'<p class="sd-why"><b>{_e(d.names[s.agent - 1])}, {_e(s.dimension)}:</b> '
                         f'<span class="sd-x">{_e(s.reasoning)}</span></p>')
        if s.error:
            notes.append(f'<p class="sd-why"><b>{_e(d.names[s.agent - 1])}, {_e(s.dimension)}, error:</b> '
                         f'<span class="sd-x">{_e(s.error)}</span></p>')
    if notes:
        parts.append("<details><summary>The judge's reasoning</summary>" + "".join(notes) + "</details>")
    elif d.scores:
        parts.append('<p class="sdlg-note">The judge gave no reasoning (e.g. constrained scoring).</p>')
    if d.judge:
        parts.append(f'<p class="sdlg-note">Judge: {_e(d.judge)}.</p>')
    return "".join(parts)


def _dialog_html(d: Dialog, judge_sample: int | None) -> str:
    models = (d.model_a, d.model_b)
    g = d.genuine
    summary = (f"{_e(d.run)} · episode {d.episode}{' (' + _e(d.codename) + ')' if d.codename else ''} · "
               f"seed {d.sim_seed} — {_n(g.n_utterances, 'utterance')}, {_END_LABEL[g.end]}")
    body = [f'<p class="sdlg-meta"><b>Run {_e(d.run)}</b> (pair {_e(d.pair)}, order {d.order}; '
            f'{_e(d.family)}): agent 1 is {_e(d.model_a)}, agent 2 is {_e(d.model_b)}. Task {d.task_index}'
            f'{", " + _e(d.relationship) if d.relationship else ""}'
            f'{", source " + _e(d.source) if d.source else ""}.</p>']
    if d.scenario is not None:
        body.append(f'<p class="sdlg-meta"><b>Scenario.</b> <span class="sd-x">{_e(d.scenario)}</span></p>')
    for a in (0, 1):
        goal = (f'<span class="sd-x">{_e(d.goals[a])}</span>' if d.goals is not None
                else '<span class="sdlg-empty">goal not available</span>')
        body.append(f'<p class="sdlg-goal"><b>Agent {a + 1}, {_e(d.names[a])}</b> '
                    f'({_e(models[a])}). Goal: {goal}</p>')
    body.append("<p class=\"sdlg-meta\"><b>The dialog</b>, each utterance as stored after post-processing "
                "(the model's raw generation is not kept):</p>")
    body.append(_turns_html(g))
    if d.passive_reader:
        body.append(f'<p class="sdlg-note">Passive reader (control 1) of this dialog: {_e(d.passive_reader)}.</p>')
    body.append("<p class=\"sdlg-meta\"><b>The judge</b> (on this dialog):</p>")
    body.append(_scores_html(d, judge_sample))
    if d.tom is not None:
        body.append(f"<details><summary>Theory-of-Mind run: a separate dialog on the same task and seed, "
                    f"{_n(d.tom.n_utterances, 'utterance')}, {_END_LABEL[d.tom.end]}</summary>"
                    "<p class=\"sdlg-note\">Each speaker was asked to open its turn with an emotion word and an "
                    "action type. Under each turn: the speaker's most probable emotion word (at the reply's "
                    "first position) and action type (after the first '.' of the reply; – where none came "
                    "within 16 tokens), each with its probability among the candidates, and whether the reply "
                    "opened with an emotion then an action word (format ✓ / ✗).</p>"
                    + _turns_html(d.tom) + "</details>")
    return (f'<details class="sdlg-dialog" data-run="{_e(d.run)}" data-pair="{_e(d.pair)}" '
            f'data-episode="{d.episode}" data-seed="{d.sim_seed}" data-end="{g.end}">'
            f"<summary>{summary}</summary>{''.join(body)}</details>")


def render_html(ds: DialogSet, element_id: str | None = None) -> str:
    """The dialogs as one self-contained HTML fragment (see the module docstring).

    Parameters
    ----------
    ds : DialogSet from :func:`collect_dialogs`
    element_id : id of the widget's root element, letters, digits, ``-`` and ``_`` (default:
        derived from the content, so the same dialogs give the same HTML and two different
        widgets on a page do not clash)

    Returns
    -------
    str
        ``<div class="sdlg" id=...>`` with an inline ``<style>``, the controls, a
        ``<details>`` per dialog and an inline ``<script>``; no external reference.
    """
    dialogs = ds.dialogs
    if element_id is None:
        h = hashlib.sha1("\n".join([ds.name] + [d.key for d in dialogs]).encode()).hexdigest()[:10]
        element_id = f"sdlg-{h}"
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", element_id):
        raise ValueError(f"element_id must be letters, digits, '-' or '_' (starting with a letter), "
                         f"got {element_id!r}")
    eid = _e(element_id)
    runs = [r for r in ds.runs]
    opts = ['<option value="">all runs</option>']
    for pair in dict.fromkeys(r.pair for r in runs):
        members = [r for r in runs if r.pair == pair]
        group = [f'<optgroup label="pair {_e(pair)}">']
        if len(members) > 1:
            group.append(f'<option value="pair:{_e(pair)}">{_e(pair)}: both speaking orders</option>')
        for r in members:
            group.append(f'<option value="run:{_e(r.name)}">{_e(r.name)}: agent 1 {_e(r.model_a)}, '
                         f'agent 2 {_e(r.model_b)}</option>')
        group.append("</optgroup>")
        opts.extend(group)
    episodes = {}
    for d in dialogs:
        episodes.setdefault(d.episode, d.codename)
    ep_opts = ['<option value="">all episodes</option>'] + [
        f'<option value="{e}">{e}{" · " + _e(c) if c else ""}</option>' for e, c in sorted(episodes.items())]
    seeds = sorted({d.sim_seed for d in dialogs})
    seed_opts = ['<option value="">all seeds</option>'] + [f'<option value="{s}">{s}</option>' for s in seeds]
    intro = (f"{_n(len(dialogs), 'dialog')} of {_n(len(runs), 'ordered run')}, each folded below; open one to "
             "read it. With JavaScript the selectors show one run, episode and seed at a time.")
    parts = [f'<div class="sdlg" id="{eid}" data-sdlg-ready="0">',
             f"<style>{_CSS.replace('{id}', element_id)}</style>",
             '<div class="sdlg-controls" hidden>',
             f'<label>Run <select data-f="run">{"".join(opts)}</select></label>',
             f'<label>Episode <select data-f="episode">{"".join(ep_opts)}</select></label>',
             f'<label>Seed <select data-f="seed">{"".join(seed_opts)}</select></label>',
             '<span><button type="button" data-step="-1" title="previous dialog">&#9664;</button> '
             '<button type="button" data-step="1" title="next dialog">&#9654;</button></span>',
             '<span class="sdlg-count sdlg-note"></span></div>',
             f'<p class="sdlg-note">{_e(intro)}</p>']
    for note in ds.notes:
        parts.append(f'<p class="sdlg-note">{_e(note)}</p>')
    left = _left_out_text(ds)
    if left:
        parts.append(f'<p class="sdlg-note">{_e(left)}</p>')
    for r in runs:
        if r.notes:
            parts.append(f'<p class="sdlg-note">Run {_e(r.name)}: {_e("; ".join(r.notes))}.</p>')
    parts.append('<p class="sdlg-none sdlg-note" hidden>No dialog matches this selection (it may be one '
                 'left out above).</p>')
    parts.extend(_dialog_html(d, ds.judge_sample) for d in dialogs)
    parts.append(f"<script>{_JS.replace('{id_js}', json.dumps(element_id))}</script></div>")
    return "\n".join(parts)


def prompts_section(results, found=None, *, run: str | None = None, episode: int | None = None,
                    seed: int | None = None, turn: int | None = None) -> tuple[str, str]:
    """The dialogs page's "What the models read": (Markdown sentence, HTML).

    One turn of one dialog of the run (:func:`synclib.figures.dialog_prompts.dialog_turn_prompts`); where the run's task
    texts are not available (e.g. synthetic test data) an illustration on embedded task 0,
    turn 0, seed 0, labelled as not from the run.
    """
    # lazy: xarray (through synclib.analysis.results) only when a results directory is read
    from synclib.analysis.results import Results, load_results

    res = results if isinstance(results, Results) else load_results(results)
    found = found if found is not None else collect_dialogs(res, max_dialogs_per_run=None)
    tasks, note = load_run_tasks(res.config.get("scenarios")) if not res.synthetic else (None, "")
    tp = prompts.dialog_turn_prompts(found, tasks, run=run, episode=episode, seed=seed, turn=turn)
    if tp is not None:
        who = ("These are the **embedded tiny models'** dialogs, not the paper's models': the utterances in the "
               "prompts are theirs. " if found.embedded else "")
        text = (f"The prompts of {tp.source}: {tp.names[tp.agent]} (agent {tp.agent + 1}) speaks. {who}"
                f"{prompts.masked_sentence(tp)} The passive reader is told it is "
                f"{tp.reader.name if tp.reader is not None else 'the agent itself'}.")
        return text, prompts.render_html(tp)

    embedded = load_tasks("embedded")
    tp = prompts.turn_prompts(embedded[0], 0, [], 0, embedded,
                      source="An illustration, not from this run: embedded task 0, turn 0, seed 0")
    why = ("Synthetic test data has no task texts" if res.synthetic
           else (note or "No dialog of the run has its task texts and a turn to show"))
    text = (f"{why}, so the run's prompts cannot be rebuilt here. Below, as an illustration only, the three "
            f"prompts of embedded task 0 at turn 0 with simulation seed 0 (no utterance yet). {prompts.masked_sentence(tp)}")
    return text, prompts.render_html(tp)
