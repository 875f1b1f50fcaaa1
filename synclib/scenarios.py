"""Sotopia-format tasks and the three prompt views of the protocol.

A task directory holds three JSON files in Sotopia's format:

``envs.json``
    scenarios keyed by id: ``codename``, ``source``, ``scenario``, ``agent_goals`` (two
    strings), ``relationship`` (int code, see :data:`RELATIONSHIPS`) and optional
    ``age_constraint`` / ``occupation_constraint`` / ``agent_constraint``.
``agents.json``
    personas keyed by id: ``first_name``, ``last_name``, ``age``, ``occupation``,
    ``gender`` (``Man`` / ``Woman`` / ``Nonbinary``), ``gender_pronoun``, ``public_info``,
    ``big_five``, ``moral_values``, ``schwartz_personal_values``,
    ``personality_and_values``, ``decision_making_style``, ``secret``, ``mbti`` and
    optional ``model_id``.
``env_agent_combos.json``
    the tasks, a list of ``{"env_id": ..., "agent_ids": [agent 1, agent 2]}``; a task's
    position in this list is its *episode* index.

:func:`load_tasks` reads such a directory (or ``"embedded"``, our own set shipped in
``data/scenarios/``) into frozen dataclasses and validates it; every problem raises one
:class:`ScenarioError` naming the file, the key and the field.

Rendering (pure text, no chat template; the model layer applies that):

* :func:`render_prompt` — the user message an agent sees before it speaks, in the
  ``"active"`` view (the genuine agent), the ``"passive"`` view (control 1: a reader in the
  agent's place) or the ``"tom"`` view (appendix J).
* :func:`judge_intro` — the complete, unmasked intro for the Sotopia-eval judge.
* :func:`postprocess_reply`, :func:`is_leave` — the dialog loop's rules.

Masking and tag rules (``protocol.md``; where it is silent we follow Sotopia's own
renderer, ``sotopia.envs.parallel`` + ``sotopia.renderers.XMLRenderer``):

* The other agent's goal is ``Unknown``.
* The other agent's bio is cut by relationship (:data:`OTHER_BIO_VISIBILITY`): stranger
  nothing, know_by_name the name only, acquaintance up to and including ``public_info``,
  friend / romantic / family all but the secret. An empty (stranger) bio is shown as
  ``Unknown``, as Sotopia's ``ScriptBackground`` does. An agent's own bio is always whole.
* ``<extra_info>``, ``<strategy_hint>``, ``<clarification_hint>``, ``<root>`` and a plain
  ``<p>``: the tags are dropped, their content kept.
* ``<p viewer="X">...</p>`` (either quote style): the content is kept only for the viewer
  ``X``. An agent ``i`` sees it when ``X == "agent_i"``; content addressed to the other
  agent or to ``"environment"`` (e.g. the mutual-friends answer) is removed together with
  its tags. The judge (the environment) sees all content.
* After tag removal, spaces that open a line are dropped and each field is stripped
  (Sotopia's ``format_docstring`` does the same to its context block).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Literal, Mapping, Sequence

from synclib.paths import EMBEDDED_SCENARIOS

__all__ = [
    "RELATIONSHIPS", "SOURCES", "GENDER_WORDS", "OTHER_BIO_VISIBILITY", "BIO_VISIBILITIES",
    "EMOTIONS", "ACTIONS", "TOM_INSTRUCTION", "LEAVE_INSTRUCTION", "VIEWS", "select_tasks",
    "ScenarioError", "Persona", "Scenario", "Task", "TaskSet",
    "embedded_dir", "load_tasks", "bio", "render_text", "render_history", "render_prompt",
    "judge_intro", "strip_tom_words", "postprocess_reply", "is_leave",
]

#: Sotopia's relationship codes.
RELATIONSHIPS: Mapping[int, str] = MappingProxyType({
    0: "stranger",
    1: "know_by_name",
    2: "acquaintance",
    3: "friend",
    4: "romantic_relationship",
    5: "family_member",
})

#: The eight scenario sources of Sotopia (``persuation_for_good`` sic).
SOURCES: tuple[str, ...] = (
    "social_chemistry", "social_iqa", "deal-or-no-deal", "mutual_friends",
    "craigslist_bargains", "persuation_for_good", "normbank", "hand-craft",
)

#: ``gender`` field -> the adjective used in a bio.
GENDER_WORDS: Mapping[str, str] = MappingProxyType(
    {"Man": "male", "Woman": "female", "Nonbinary": "nonbinary"})

#: How much of a bio can be shown, from nothing to everything.
BIO_VISIBILITIES: tuple[str, ...] = ("none", "name", "public", "no_secret", "full")

#: relationship code -> how much of the *other* agent's bio an agent sees.
OTHER_BIO_VISIBILITY: Mapping[int, str] = MappingProxyType({
    0: "none", 1: "name", 2: "public", 3: "no_secret", 4: "no_secret", 5: "no_secret"})

#: ToM target words, in the protocol's order.
EMOTIONS: tuple[str, ...] = (
    "Joy", "Trust", "Fear", "Surprise", "Sadness", "Disgust", "Anger", "Anticipation")
ACTIONS: tuple[str, ...] = (
    "Assertive", "Directive", "Commissive", "Expressive", "Declaration")

VIEWS: tuple[str, ...] = ("active", "passive", "tom")
View = Literal["active", "passive", "tom"]

LEAVE_INSTRUCTION = (
    'If your goal as the agent has been achieved, you should leave the conversation by '
    'saying "LEAVE". If your goal has not been achieved, you should say something to '
    'interact with the other. Keep your words concise.')

TOM_INSTRUCTION = (
    "Please be sure to indicate your emotion and action type both in a word at the "
    "beginning of your turn, in the format of: Emotion. Action type. Response. Emotion "
    "should be one of the following words: Joy. Trust. Fear. Surprise. Sadness. Disgust. "
    "Anger. Anticipation.; Action type should be one of the following words: Assertive. "
    "Directive. Commissive. Expressive. Declaration. Your output format should be: "
    "Emotion. Action type. Response.")

ENV_FILE, AGENTS_FILE, COMBOS_FILE = "envs.json", "agents.json", "env_agent_combos.json"


class ScenarioError(ValueError):
    """A task directory is missing, unreadable or invalid.

    Attributes
    ----------
    file : str
        The file (or directory) at fault.
    key : str or None
        The record's id (``envs.json`` / ``agents.json``) or ``[index]``
        (``env_agent_combos.json``); None for file-level problems.
    field : str or None
        The field at fault; None for record- or file-level problems.
    """

    def __init__(self, file: str | Path, key: str | None, field: str | None, problem: str):
        self.file, self.key, self.field, self.problem = str(file), key, field, problem
        where = [self.file]
        if key is not None:
            where.append(f"key {key!r}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(": ".join(where) + ": " + problem)


# ----------------------------------------------------------------------------- data

@dataclass(frozen=True)
class Persona:
    """A character (one record of ``agents.json``)."""

    pk: str
    first_name: str
    last_name: str
    age: int
    occupation: str
    gender: str
    gender_pronoun: str
    public_info: str
    big_five: str
    moral_values: tuple[str, ...]
    schwartz_personal_values: tuple[str, ...]
    personality_and_values: str
    decision_making_style: str
    secret: str
    mbti: str
    model_id: str = ""

    @property
    def name(self) -> str:
        """``"First Last"``."""
        return f"{self.first_name} {self.last_name}"


@dataclass(frozen=True)
class Scenario:
    """A scenario (one record of ``envs.json``); ``agent_goals[i]`` is agent ``i+1``'s."""

    pk: str
    codename: str
    source: str
    scenario: str
    agent_goals: tuple[str, str]
    relationship: int
    age_constraint: str | None = None
    occupation_constraint: str | None = None
    agent_constraint: tuple[tuple[str, ...], ...] | None = None

    @property
    def relationship_name(self) -> str:
        """The relationship's name, e.g. ``"friend"``."""
        return RELATIONSHIPS[self.relationship]


@dataclass(frozen=True)
class Task:
    """One task (episode): a scenario played by two personas.

    ``index`` is the position in ``env_agent_combos.json``; ``agents`` is
    (agent 1, agent 2); agent 1 speaks at even utterance indices.
    """

    index: int
    pk: str
    env: Scenario
    agents: tuple[Persona, Persona]

    @property
    def names(self) -> tuple[str, str]:
        return self.agents[0].name, self.agents[1].name

    @property
    def relationship(self) -> int:
        return self.env.relationship

    @property
    def source(self) -> str:
        return self.env.source

    @property
    def codename(self) -> str:
        return self.env.codename


@dataclass(frozen=True, eq=False)
class TaskSet:
    """A loaded task directory; iterating or indexing gives :class:`Task` objects.

    ``scenarios`` and ``personas`` are read-only mappings id -> object, in file order.
    """

    root: Path
    scenarios: Mapping[str, Scenario]
    personas: Mapping[str, Persona]
    tasks: tuple[Task, ...]

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __getitem__(self, index: int) -> Task:
        return self.tasks[index]


# -------------------------------------------------------------------------- loading

def embedded_dir() -> Path:
    """The directory of our own scenario set, ``<repo root>/data/scenarios``."""
    return EMBEDDED_SCENARIOS


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise ScenarioError(path, None, None, "file not found")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise ScenarioError(path, None, None,
                            f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                            ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(path, None, None, f"cannot be read: {exc}") from None


_TYPE_NAMES = {str: "a string", int: "an integer", list: "a list"}


def _field(rec: dict, name: str, typ: type, file: Path, key: str, optional: bool = False,
           default: Any = None) -> Any:
    """Fetch ``rec[name]`` and check its JSON type (bool never counts as int)."""
    if name not in rec:
        if optional:
            return default
        raise ScenarioError(file, key, name, "missing")
    value = rec[name]
    if optional and value is None:
        return default
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ScenarioError(file, key, name,
                            f"expected {_TYPE_NAMES[typ]}, got {type(value).__name__} {value!r:.60}")
    return value


def _str_list(rec: dict, name: str, file: Path, key: str, length: int | None = None,
              optional: bool = False) -> tuple[str, ...] | None:
    value = _field(rec, name, list, file, key, optional=optional)
    if value is None:
        return None
    if length is not None and len(value) != length:
        raise ScenarioError(file, key, name, f"expected exactly {length} entries, got {len(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ScenarioError(file, key, f"{name}[{i}]",
                                f"expected a string, got {type(item).__name__} {item!r:.60}")
    return tuple(value)


def _records(data: Any, file: Path) -> dict:
    if not isinstance(data, dict):
        raise ScenarioError(file, None, None,
                            f"expected a JSON object keyed by id, got {type(data).__name__}")
    for key, rec in data.items():
        if not isinstance(rec, dict):
            raise ScenarioError(file, key, None, f"expected an object, got {type(rec).__name__}")
        pk = rec.get("pk", key)
        if pk != key:
            raise ScenarioError(file, key, "pk", f"{pk!r} differs from its key")
    return data


def _parse_scenario(key: str, rec: dict, file: Path) -> Scenario:
    rel = _field(rec, "relationship", int, file, key)
    if rel not in RELATIONSHIPS:
        known = ", ".join(f"{c} {n}" for c, n in RELATIONSHIPS.items())
        raise ScenarioError(file, key, "relationship",
                            f"unknown relationship code {rel} (known: {known})")
    constraint = rec.get("agent_constraint")
    if constraint is not None:
        if not (isinstance(constraint, list)
                and all(isinstance(c, list) and all(isinstance(s, str) for s in c)
                        for c in constraint)):
            raise ScenarioError(file, key, "agent_constraint",
                                f"expected null or a list of lists of agent ids, got {constraint!r:.60}")
        constraint = tuple(tuple(c) for c in constraint)
    return Scenario(
        pk=key,
        codename=_field(rec, "codename", str, file, key),
        source=_field(rec, "source", str, file, key),
        scenario=_field(rec, "scenario", str, file, key),
        agent_goals=_str_list(rec, "agent_goals", file, key, length=2),
        relationship=rel,
        age_constraint=_field(rec, "age_constraint", str, file, key, optional=True),
        occupation_constraint=_field(rec, "occupation_constraint", str, file, key, optional=True),
        agent_constraint=constraint,
    )


_PERSONA_STR_FIELDS = ("first_name", "last_name", "occupation", "gender", "gender_pronoun",
                       "public_info", "big_five", "personality_and_values",
                       "decision_making_style", "secret", "mbti")


def _parse_persona(key: str, rec: dict, file: Path) -> Persona:
    values = {name: _field(rec, name, str, file, key) for name in _PERSONA_STR_FIELDS}
    if values["gender"] not in GENDER_WORDS:
        raise ScenarioError(file, key, "gender",
                            f"expected one of {', '.join(GENDER_WORDS)}, got {values['gender']!r}")
    age = _field(rec, "age", int, file, key)
    if age < 0:
        raise ScenarioError(file, key, "age", f"must not be negative, got {age}")
    return Persona(
        pk=key, age=age,
        moral_values=_str_list(rec, "moral_values", file, key),
        schwartz_personal_values=_str_list(rec, "schwartz_personal_values", file, key),
        model_id=_field(rec, "model_id", str, file, key, optional=True, default=""),
        **values,
    )


def load_tasks(path: str | Path = "embedded") -> TaskSet:
    """Load and validate a Sotopia-format task directory.

    Parameters
    ----------
    path : str or Path
        A directory holding ``envs.json``, ``agents.json`` and ``env_agent_combos.json``,
        or ``"embedded"`` for our own set (:func:`embedded_dir`).

    Returns
    -------
    TaskSet
        ``tasks[i]`` is the i-th entry of ``env_agent_combos.json`` (episode ``i``).

    Raises
    ------
    ScenarioError
        On a missing file, invalid JSON, a missing or mistyped field, an unknown
        relationship code or gender, the wrong number of goals or agents, or a task
        naming an unknown scenario or persona; the message names file, key and field.
    """
    root = embedded_dir() if str(path) == "embedded" else Path(path).expanduser()
    if not root.is_dir():
        raise ScenarioError(root, None, None,
                            "task directory not found (expected envs.json, agents.json, "
                            "env_agent_combos.json)")
    env_file, agents_file, combos_file = root / ENV_FILE, root / AGENTS_FILE, root / COMBOS_FILE

    envs = _records(_read_json(env_file), env_file)
    scenarios = {k: _parse_scenario(k, rec, env_file) for k, rec in envs.items()}
    agents = _records(_read_json(agents_file), agents_file)
    personas = {k: _parse_persona(k, rec, agents_file) for k, rec in agents.items()}

    combos = _read_json(combos_file)
    if not isinstance(combos, list):
        raise ScenarioError(combos_file, None, None,
                            f"expected a JSON list of tasks, got {type(combos).__name__}")
    tasks = []
    for i, rec in enumerate(combos):
        key = f"[{i}]"
        if not isinstance(rec, dict):
            raise ScenarioError(combos_file, key, None,
                                f"expected an object, got {type(rec).__name__}")
        env_id = _field(rec, "env_id", str, combos_file, key)
        if env_id not in scenarios:
            raise ScenarioError(combos_file, key, "env_id",
                                f"unknown scenario {env_id!r} (not a key of {ENV_FILE})")
        agent_ids = _str_list(rec, "agent_ids", combos_file, key, length=2)
        for j, aid in enumerate(agent_ids):
            if aid not in personas:
                raise ScenarioError(combos_file, key, f"agent_ids[{j}]",
                                    f"unknown persona {aid!r} (not a key of {AGENTS_FILE})")
        if agent_ids[0] == agent_ids[1]:
            raise ScenarioError(combos_file, key, "agent_ids",
                                f"both agents are the same persona {agent_ids[0]!r}")
        pk = _field(rec, "pk", str, combos_file, key, optional=True, default=key)
        tasks.append(Task(index=i, pk=pk, env=scenarios[env_id],
                          agents=(personas[agent_ids[0]], personas[agent_ids[1]])))
    return TaskSet(root=root, scenarios=MappingProxyType(scenarios),
                   personas=MappingProxyType(personas), tasks=tuple(tasks))


def select_tasks(taskset: TaskSet, episodes) -> list[Task]:
    """The tasks a run plays: the first ``episodes`` tasks, or those with the given indices.

    Parameters
    ----------
    taskset : TaskSet
    episodes : int >= 1, or a sequence of distinct task indices (in the order to play them)

    Returns
    -------
    list of Task

    Raises
    ------
    ValueError
        when ``episodes`` asks for more tasks than the set holds, names an index outside
        it or repeats one; the message names the set and its size.
    """
    n = len(taskset.tasks)
    where = f"{'embedded' if taskset.root == embedded_dir() else taskset.root} has {n} tasks (0-{n - 1})"
    if isinstance(episodes, int) and not isinstance(episodes, bool):
        if not 1 <= episodes <= n:
            raise ValueError(f"episodes = {episodes}: {where}")
        return list(taskset.tasks[:episodes])
    idx = [int(i) for i in episodes]
    bad = [i for i in idx if not 0 <= i < n]
    if bad:
        raise ValueError(f"task index {bad[0]} is out of range: {where}")
    if len(set(idx)) != len(idx):
        raise ValueError(f"task indices repeat: {sorted(i for i in set(idx) if idx.count(i) > 1)}")
    return [taskset.tasks[i] for i in idx]


# ------------------------------------------------------------------------ rendering

_VIEWER_P = re.compile(
    r"<p\s+viewer\s*=\s*(['\"])(?P<viewer>[^'\"]*)\1\s*>"
    r"(?P<body>(?:(?!<p[\s>]).)*?)</p\s*>", re.S)
_UNCLOSED_VIEWER_P = re.compile(
    r"<p\s+viewer\s*=\s*(['\"])(?P<viewer>[^'\"]*)\1\s*>(?P<body>.*)$", re.S)
_KEEP_CONTENT_TAGS = re.compile(
    r"</?(?:extra_info|strategy_hint|clarification_hint|root|p)\b[^>]*>")


def render_text(text: str, viewer: str = "environment") -> str:
    """Strip Sotopia's inline tags from ``text`` as ``viewer`` sees it.

    Parameters
    ----------
    text : str
        Raw scenario / goal / bio text.
    viewer : str
        ``"agent_0"``, ``"agent_1"`` or ``"environment"`` (the judge, sees everything).

    Returns
    -------
    str
        ``<p viewer="X">`` content kept only when ``X == viewer`` (or for the
        environment; an unclosed one runs to the end of the text); all other tags of Sotopia's set removed with their content kept;
        spaces opening a line dropped; the result stripped.
    """
    def keep(match: re.Match) -> str:
        return match["body"] if viewer == "environment" or match["viewer"] == viewer else ""

    prev = None
    while prev != text:  # innermost <p viewer> first, until none is left
        prev, text = text, _VIEWER_P.sub(keep, text)
    text = _UNCLOSED_VIEWER_P.sub(keep, text)  # an unclosed <p viewer> runs to the end
    text = _KEEP_CONTENT_TAGS.sub("", text)
    return re.sub(r"\n +", "\n", text).strip()


def bio(persona: Persona, visibility: str = "full") -> str:
    """A persona's bio, cut to ``visibility`` (one of :data:`BIO_VISIBILITIES`).

    ``full``: ``"{First Last} is a {age}-year-old {male|female|nonbinary} {occupation
    lowercased}. {pronoun} pronouns. {public_info} Personality and values description:
    {personality_and_values} {First}'s secrets: {secret}"``; ``no_secret`` ends before
    ``"{First}'s secrets"``, ``public`` after ``public_info``, ``name`` is ``"{First
    Last}"`` and ``none`` is ``""``.
    """
    if visibility not in BIO_VISIBILITIES:
        raise ValueError(f"visibility must be one of {BIO_VISIBILITIES}, got {visibility!r}")
    p = persona
    parts = [
        ("name", p.name),
        ("public", f"is a {p.age}-year-old {GENDER_WORDS[p.gender]} {p.occupation.lower()}. "
                   f"{p.gender_pronoun} pronouns. {p.public_info}"),
        ("no_secret", f"Personality and values description: {p.personality_and_values}"),
        ("full", f"{p.first_name}'s secrets: {p.secret}"),
    ]
    upto = BIO_VISIBILITIES.index(visibility)
    return " ".join(text for level, text in parts if BIO_VISIBILITIES.index(level) <= upto)


def _check_agent(agent: int) -> None:
    if agent not in (0, 1) or isinstance(agent, bool):
        raise ValueError(f"agent must be 0 (agent 1) or 1 (agent 2), got {agent!r}")


def _context_lines(task: Task, viewer: int | None) -> list[str]:
    """The "Here is the context of this interaction" block as agent ``viewer`` sees it
    (None: the judge, everything unmasked)."""
    tag_viewer = "environment" if viewer is None else f"agent_{viewer}"
    env, names = task.env, task.names
    lines = ["Here is the context of this interaction:",
             f"Scenario: {render_text(env.scenario, tag_viewer)}",
             f"Participants: {names[0]} and {names[1]}"]
    for i, persona in enumerate(task.agents):
        vis = "full" if viewer in (None, i) else OTHER_BIO_VISIBILITY[env.relationship]
        text = render_text(bio(persona, vis), tag_viewer)
        lines.append(f"{names[i]}'s background: {text or 'Unknown'}")
    for i, goal in enumerate(env.agent_goals):
        text = render_text(goal, tag_viewer) if viewer in (None, i) else "Unknown"
        lines.append(f"{names[i]}'s goal: {text}")
    return lines


def render_history(task: Task, history: Sequence[str], viewer: int | None = None,
                   tom: bool = False) -> list[str]:
    """Dialog lines ``"Turn {i}: {speaker} said: {utterance}"``; agent 1 speaks at even i.

    With ``tom=True`` the utterances of the agent other than ``viewer`` lose their
    leading emotion/action words (:func:`strip_tom_words`).
    """
    lines = []
    for i, utterance in enumerate(history):
        if not isinstance(utterance, str):
            raise TypeError(f"history[{i}] must be a str, got {type(utterance).__name__}")
        speaker = i % 2
        if tom and viewer is not None and speaker != viewer:
            utterance = strip_tom_words(utterance)
        lines.append(f"Turn {i}: {task.names[speaker]} said: {utterance}")
    return lines


def render_prompt(task: Task, agent: int, history: Sequence[str] = (),
                  view: View = "active") -> str:
    """The user message (no chat template) for ``agent`` before utterance ``len(history)``.

    Parameters
    ----------
    task : Task
    agent : int
        0 (agent 1) or 1 (agent 2); in the passive view, the agent the reader replaces.
        It must be that agent's turn: ``len(history) % 2 == agent``.
    history : sequence of str
        The post-processed utterances so far (index = turn).
    view : {"active", "passive", "tom"}
        ``active``: the protocol's prompt. ``passive``: the three opening lines become
        ``"Imagine you are {name}. You are reading an interaction between other two
        people."`` and the leave/concise instruction is dropped; the context is the
        replaced agent's. ``tom``: the active prompt with :data:`TOM_INSTRUCTION` after
        the leave instruction, and the other agent's utterances without their
        emotion/action words.

    Returns
    -------
    str
        Lines joined by ``"\\n"``, ending with ``"Turn {t}: {name} said:"``.
    """
    _check_agent(agent)
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    if isinstance(history, str):
        raise TypeError("history must be a sequence of utterances, not a single str")
    t = len(history)
    if t % 2 != agent:
        raise ValueError(f"turn {t} belongs to agent {t % 2} (agent {t % 2 + 1}), "
                         f"not to agent {agent}")
    me = task.names[agent]
    if view == "passive":
        lines = [f"Imagine you are {me}. You are reading an interaction between other two people."]
    else:
        lines = [
            f"Imagine you are {me}, your task is to act/speak as {me} would, keeping in mind "
            f"{me}'s social goal.",
            f"You can find {me}'s goal (or background) in the 'Here is the context of the "
            f"interaction' field.",
            f"Note that {me}'s goal is only visible to you.",
        ]
    lines += _context_lines(task, agent)
    if view != "passive":
        lines.append(LEAVE_INSTRUCTION)
    if view == "tom":
        lines.append(TOM_INSTRUCTION)
    lines += render_history(task, history, viewer=agent, tom=(view == "tom"))
    lines.append(f"Turn {t}: {me} said:")
    return "\n".join(lines)


def judge_intro(task: Task) -> str:
    """The complete, unmasked intro for the judge: scenario, participants, both full bios
    and both goals (all tag content kept), as ``"\\n"``-joined lines."""
    return "\n".join(_context_lines(task, None))


# ----------------------------------------------------------------------- dialog rules

_TOM_WORD = re.compile(
    r"^\s*[*_\"'`]*\s*(?:(?:emotion|action(?:\s+type)?)\s*[:=-]\s*)?[*_\"'`]*"
    r"(?P<word>" + "|".join(EMOTIONS + ACTIONS) + r")[*_\"'`]*\s*(?:[.,:;!]+|$)[*_\"'`]*",
    re.I)
_RESPONSE_LABEL = re.compile(r"^\s*[*_]*response\s*[:=-]\s*[*_]*", re.I)


def strip_tom_words(utterance: str) -> str:
    """Remove the leading emotion and action-type words of a ToM-format utterance.

    ``"Joy. Assertive. Let's go."`` -> ``"Let's go."``. At most one emotion and one action
    word are removed, in either order, each followed by punctuation (``. , : ; !``) or the
    end of text, optionally labelled (``Emotion: Joy.``) or wrapped in ``*`` / quotes; a
    following ``Response:`` label goes too. Text without such a prefix is returned
    stripped but otherwise unchanged (``"Trust me, ..."`` keeps its first word).
    """
    text, seen = utterance, set()
    for _ in range(2):
        match = _TOM_WORD.match(text)
        if not match:
            break
        word = match["word"].capitalize()
        kind = "emotion" if word in EMOTIONS else "action"
        if kind in seen:
            break
        seen.add(kind)
        text = text[match.end():]
    if seen:
        text = _RESPONSE_LABEL.sub("", text, count=1)
    return text.strip()


def postprocess_reply(text: str) -> str:
    """The protocol's reply clean-up: keep the first line; if it contains ``": "``
    (colon, space), drop everything up to and including the first one.

    Surrounding whitespace is stripped first (so a reply that opens with a newline keeps
    its first non-empty line) and from the result.
    """
    line = text.strip().split("\n", 1)[0]
    if ": " in line:
        line = line.split(": ", 1)[1]
    return line.strip()


def is_leave(utterance: str) -> bool:
    """True when the (stripped, lowercased) utterance's first or last 10 characters
    contain ``"leave"`` or ``"left"``: the episode ends after it."""
    u = utterance.strip().lower()
    return any(w in part for part in (u[:10], u[-10:]) for w in ("leave", "left"))


# ---------------------------------------------------------------------- small CLI

def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options for printing one rendered prompt (``python -m synclib.scenarios``)."""
    parser.add_argument("--tasks", default="embedded",
                        help="task directory in Sotopia's format, or 'embedded' (default)")
    parser.add_argument("--task", type=int, default=0, help="task index (episode), default 0")
    parser.add_argument("--agent", type=int, default=0, choices=(0, 1),
                        help="0 = agent 1, 1 = agent 2 (default 0)")
    parser.add_argument("--view", default="active", choices=VIEWS + ("judge",),
                        help="prompt view; 'judge' prints the unmasked intro (default active)")
    parser.add_argument("--history", nargs="*", default=[],
                        help="utterances so far, in order (their count must match --agent's turn)")


def run(args: argparse.Namespace) -> int:
    """Print the prompt selected by ``args``; 0 on success, 2 on bad input."""
    try:
        tasks = load_tasks(args.tasks)
        task = tasks[args.task]
        if args.view == "judge":
            print(judge_intro(task))
        else:
            print(render_prompt(task, args.agent, args.history, args.view))
    except (ValueError, IndexError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    _parser = argparse.ArgumentParser(prog="python -m synclib.scenarios",
                                      description="Print one rendered prompt.")
    configure_parser(_parser)
    sys.exit(run(_parser.parse_args()))
