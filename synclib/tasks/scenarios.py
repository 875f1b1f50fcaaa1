"""Sotopia-format tasks: the task files, their vocabularies and their loading.

A task directory holds three JSON files in Sotopia's format:

``envs.json``
    scenarios keyed by id: ``codename``, ``source``, ``scenario``, ``agent_goals`` (two strings),
    ``relationship`` (:data:`RELATIONSHIPS` code), optional ``age_constraint`` / ``occupation_constraint`` /
    ``agent_constraint``.
``agents.json``
    personas keyed by id: ``first_name``, ``last_name``, ``age``, ``occupation``, ``gender`` (``Man`` /
    ``Woman`` / ``Nonbinary``), ``gender_pronoun``, ``public_info``, ``big_five``, ``moral_values``,
    ``schwartz_personal_values``, ``personality_and_values``, ``decision_making_style``, ``secret``, ``mbti``,
    optional ``model_id``.
``env_agent_combos.json``
    the tasks, ``[{"env_id": ..., "agent_ids": [agent 1, agent 2]}, ...]``; the position is the *episode* index.

:func:`load_tasks` validates such a directory into frozen dataclasses keeping every string as the file has it.
The prompts rendered from these tasks are :mod:`synclib.tasks.prompts`'.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping

from synclib.paths import EMBEDDED_SCENARIOS
from synclib.tasks import datasets

__all__ = [
    "RELATIONSHIPS", "CLOSENESS_CODES", "SOURCES", "GENDER_WORDS", "select_tasks", "count_tasks",
    "ScenarioError", "Persona", "Scenario", "Task", "TaskSet",
    "embedded_dir", "task_dir", "load_tasks",
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

#: The relationship codes appendix G names, in the paper's order of closeness.  family_member (5) occurs in none
#: of the paper's 450 tasks, so it stays a category outside this order.
CLOSENESS_CODES: tuple[int, ...] = (0, 1, 2, 3, 4)

#: The eight scenario sources of Sotopia (``persuation_for_good`` sic).
SOURCES: tuple[str, ...] = (
    "social_chemistry", "social_iqa", "deal-or-no-deal", "mutual_friends",
    "craigslist_bargains", "persuation_for_good", "normbank", "hand-craft",
)

#: ``gender`` field -> the adjective used in a bio.
GENDER_WORDS: Mapping[str, str] = MappingProxyType(
    {"Man": "male", "Woman": "female", "Nonbinary": "nonbinary"})

ENV_FILE, AGENTS_FILE, COMBOS_FILE = "envs.json", "agents.json", "env_agent_combos.json"


class ScenarioError(ValueError):
    """A task directory is missing, unreadable or invalid: ``file`` (or directory) at fault, ``key`` (a record's
    id, or ``[index]`` in ``env_agent_combos.json``) and ``field``, None where the problem is wider."""

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
    """One task (episode): a scenario played by ``agents`` (agent 1, who speaks at even utterances, agent 2);
    ``index`` is the position in ``env_agent_combos.json``."""

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
    """A loaded task directory of :class:`Task` objects; ``scenarios`` and ``personas`` map id -> object in
    file order."""

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


def task_dir(path: str | Path = "embedded", download: bool = True) -> Path:
    """The folder of a task set as configs name it: ``"embedded"`` (:func:`embedded_dir`), a name of
    :data:`synclib.tasks.datasets.TASK_SETS` (its cache folder, fetched on first use unless not ``download``:
    then a missing file raises :class:`~synclib.tasks.datasets.DatasetError`), or a folder."""
    if str(path) == "embedded":
        return embedded_dir()
    if str(path) in datasets.TASK_SETS:
        return datasets.path(datasets.TASK_SETS[str(path)], download=download)
    return Path(path).expanduser()


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise ScenarioError(path, None, None, "file not found")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh, object_pairs_hook=functools.partial(_unique_keys, path))
    except json.JSONDecodeError as exc:
        raise ScenarioError(path, None, None,
                            f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                            ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(path, None, None, f"cannot be read: {exc}") from None


def _unique_keys(path: Path, pairs: list) -> dict:
    """A JSON object, refusing a repeated key (which would silently replace a record)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise ScenarioError(path, k, None, "this key appears twice in one object; the second "
                                "would silently replace the first")
        out[k] = v
    return out


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
        A task directory, ``"embedded"`` or ``"sotopia"`` (:func:`task_dir`).

    Returns a TaskSet: ``tasks[i]`` is the i-th entry of ``env_agent_combos.json`` (episode ``i``).

    Raises
    ------
    ScenarioError
        On a missing file, invalid JSON, a missing or mistyped field, an unknown relationship code or gender,
        the wrong number of goals or agents, or an unknown scenario or persona.
    synclib.tasks.datasets.DatasetError
        ``"sotopia"`` could not be fetched (the message says how to fetch it by hand).
    """
    root = task_dir(path)
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
    """The tasks a run plays: the first ``episodes`` (int >= 1) tasks, or those with the given distinct indices,
    in that order.  Raises ValueError, naming the set and its size, for too many tasks, an index outside the set
    or a repeated one."""
    where = "embedded" if taskset.root == embedded_dir() else str(taskset.root)
    return [taskset.tasks[i] for i in _selected(len(taskset.tasks), episodes, where)]


def _selected(n: int, episodes, where: str) -> list[int]:
    """The indices ``episodes`` picks from a set of ``n`` tasks (:func:`select_tasks`)."""
    where = f"{where} has {n} tasks (0-{n - 1})"
    if isinstance(episodes, int) and not isinstance(episodes, bool):
        if not 1 <= episodes <= n:
            raise ValueError(f"episodes = {episodes}: {where}")
        return list(range(episodes))
    idx = [int(i) for i in episodes]
    bad = [i for i in idx if not 0 <= i < n]
    if bad:
        raise ValueError(f"task index {bad[0]} is out of range: {where}")
    if len(set(idx)) != len(idx):
        raise ValueError(f"task indices repeat: {sorted(i for i in set(idx) if idx.count(i) > 1)}")
    return idx


def count_tasks(path: str | Path, episodes) -> int:
    """How many tasks a run of ``episodes`` plays from ``path``, without fetching it (an uncached dataset counts
    by :attr:`~synclib.tasks.datasets.Dataset.n_tasks`, for the dry run).  Raises as :func:`select_tasks`."""
    ds = datasets.TASK_SETS.get(str(path))
    if ds is not None and ds.n_tasks and not datasets.is_cached(ds):
        return len(_selected(ds.n_tasks, episodes, f"{ds.name} (not fetched yet)"))
    return len(select_tasks(load_tasks(path), episodes))
