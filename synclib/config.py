"""The run configuration: loading a run config and refusing its mistakes.

The keys, each with its type, range, default and step (:attr:`Key.step`: the step a change re-runs, with what
depends on it), are data in :mod:`synclib.keys` (re-exported here). A run config is a YAML file plus ``--set
KEY=VALUE`` overrides; :func:`load_config` reads both, refuses any mistake before work starts (an unknown key
names the closest valid one; a bad value names the key, the value and what is allowed; every message names the
file or override it came from) and returns a plain, complete ``dict``.
"""
from __future__ import annotations

import copy
import csv
import difflib
import os
from pathlib import Path
from typing import Any

import yaml

from synclib.cluster import ClusterError, spec_of
from synclib.cube.schema import check_passive_seeds
from synclib.keys import (_BAD, _BY_PATH, _SECTIONS, KEYS, MODEL_KEYS, STEPS, Key, check_setting,
                          default, invalidation_table, keys_of_step)
from synclib.paths import DEFAULT_CONFIG, REPO_ROOT
from synclib.tasks import datasets
from synclib.tasks.datasets import TASK_SETS
from synclib.tasks.scenarios import ScenarioError, load_tasks, select_tasks

__all__ = ["ConfigError", "Key", "KEYS", "STEPS", "load_config", "validate_config", "default", "check_setting",
           "keys_of_step", "invalidation_table", "MODEL_KEYS"]


class ConfigError(ValueError):
    """A run configuration is invalid; the message names the file or override and the key."""


# --------------------------------------------------------------------------- loading
#: keys that were renamed or split: old key -> what to write instead
_RENAMED = {"simulate.batch_size": "simulate.units_per_part (episode x seed units per cube part) and, if "
                                   "the rows per forward pass should differ, simulate.max_rows"}
#: keys that were removed: old key -> why, and what replaces them
_REMOVED = {"analysis.equal_samples": "every control is now compared with genuine on the rows both hold (the "
                                      "analysis' contrasts, always computed); delete the key"}


def _did_you_mean(path: str, candidates) -> str:
    if path in _RENAMED:
        return f" (it was renamed: use {_RENAMED[path]})"
    if path in _REMOVED:
        return f" (it was removed: {_REMOVED[path]})"
    close = difflib.get_close_matches(path, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _flatten(cfg: dict, origin: dict, default_source: str) -> dict[str, tuple[Any, str]]:
    """``{dotted key: (value, source)}`` of a nested config; unknown keys raise."""
    flat = {}
    for top, value in cfg.items():
        src = origin.get(str(top), default_source)
        if top in ("models", "cluster") or top in _BY_PATH and top not in _SECTIONS:
            flat[str(top)] = (value, src)
            continue
        if top in _SECTIONS:
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise ConfigError(f"{src}: {top!r} must be a section (a mapping), got {value!r}")
            for sub, v in value.items():
                path = f"{top}.{sub}"
                s = origin.get(path, src)
                if path not in _BY_PATH:
                    raise ConfigError(f"{s}: unknown key {path!r}{_did_you_mean(path, _BY_PATH)}")
                flat[path] = (v, s)
            continue
        raise ConfigError(f"{src}: unknown key {str(top)!r}{_did_you_mean(str(top), list(_BY_PATH) + list(_SECTIONS))}")
    return flat


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set simulate.episodes=12")
    key, value = item.split("=", 1)
    key = key.strip()
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {item!r}: the value is not valid YAML: {exc}") from None
    return key, parsed


def _apply_override(cfg: dict, origin: dict, item: str) -> None:
    key, value = _parse_override(item)
    src = f"--set {item}"
    head, _, rest = key.partition(".")
    if key in _SECTIONS:
        example = next(p for p in _BY_PATH if p.startswith(key + "."))
        raise ConfigError(f"{src}: {key!r} is a section, not a key; set one of its keys, e.g. --set {example}=...")
    if key not in _BY_PATH and head not in ("models", "cluster"):
        raise ConfigError(f"{src}: unknown key {key!r}{_did_you_mean(key, _BY_PATH)}")
    node = cfg
    parts = key.split(".")
    for p in parts[:-1]:
        if node.get(p) is None:
            node[p] = {}
        node = node[p]
        if not isinstance(node, dict):
            raise ConfigError(f"{src}: {p!r} is not a section")
    node[parts[-1]] = value
    origin[key] = src


def load_config(path: str | os.PathLike | None = None, overrides=()) -> dict:
    """Read a YAML run config, apply ``KEY=VALUE`` overrides and validate it; raises :class:`ConfigError`.
    Relative paths are resolved against the repository root when the file lies in it, else the file's folder."""
    path = Path(path or DEFAULT_CONFIG)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    origin: dict[str, str] = {}
    for item in overrides:
        _apply_override(cfg, origin, item)
    base = REPO_ROOT if REPO_ROOT in path.resolve().parents else path.resolve().parent
    return validate_config(cfg, source=str(path), base=base, origin=origin)


def _check_value(path: str, value, src: str):
    key = _BY_PATH[path]
    out = key.check(value)
    if out is _BAD:
        raise ConfigError(f"{src}: {path} = {value!r} is not allowed: must be {key.check.allowed}")
    return out


def _models(value, src: str) -> dict:
    models = {}
    for name, m in value.items():
        if isinstance(m, str):
            m = {"spec": m}
        if not isinstance(m, dict) or "spec" not in m:
            raise ConfigError(f"{src}: models.{name} needs a 'spec' (model name, path or hub id)")
        for k, v in m.items():
            if k not in MODEL_KEYS:
                hint = _did_you_mean(f"models.{name}.{k}", [f"models.{name}.{x}" for x in MODEL_KEYS])
                raise ConfigError(f"{src}: unknown key 'models.{name}.{k}'{hint}")
            if MODEL_KEYS[k](v) is _BAD:
                raise ConfigError(f"{src}: models.{name}.{k} = {v!r} is not allowed: must be {MODEL_KEYS[k].allowed}")
        models[str(name)] = {"spec": m["spec"], "family": m.get("family", str(name)), "label": m.get("label", m["spec"]),
                             "prompt_format": m.get("prompt_format", "chat_template")}
    if not models:
        raise ConfigError(f"{src}: 'models' is empty")
    return models


def validate_config(cfg: dict, source: str = "<config>", base: Path = REPO_ROOT, origin: dict | None = None) -> dict:
    """Check every key and cross-reference, fill defaults, resolve paths; a new dict. ``origin``: dotted key ->
    the override that set it (for messages)."""
    origin = origin or {}
    flat = _flatten(copy.deepcopy(cfg), origin, source)
    out: dict = {}
    for key in KEYS:
        if key.path in flat:
            value, src = flat[key.path]
            if key.path == "models":
                value = _models(value, src) if isinstance(value, dict) else _check_value(key.path, value, src)
            else:
                value = _check_value(key.path, value, src)
        elif key.required:
            raise ConfigError(f"{source}: missing key {key.path!r} ({key.help})")
        else:
            value = copy.deepcopy(key.default)
        head, _, sub = key.path.partition(".")
        (out.setdefault(head, {}).__setitem__(sub, value) if sub else out.__setitem__(head, value))
    _cross_check(out, flat, source, base)
    return out


def _src(flat, path, source):
    return flat.get(path, (None, source))[1]


def _cross_check(cfg: dict, flat: dict, source: str, base: Path) -> None:
    models = cfg["models"]
    seen: dict[frozenset, str] = {}
    for p in cfg["pairs"]:
        parts = p.split("-")
        if len(parts) != 2 or any(x not in models for x in parts):
            raise ConfigError(f"{_src(flat, 'pairs', source)}: pairs entry {p!r} must be 'A-B' with A and B keys "
                              f"of 'models' ({', '.join(models)})")
        key = frozenset(parts)
        if key in seen:
            raise ConfigError(f"{_src(flat, 'pairs', source)}: pairs {seen[key]!r} and {p!r} name the same two "
                              "models; list each pair once ('orders: both' plays it in both speaking orders)")
        seen[key] = p

    def resolve(p):
        return str((base / p).resolve()) if p is not None and not Path(p).is_absolute() else p

    cfg["results_dir"] = resolve(cfg["results_dir"])

    if cfg["scenarios"] in TASK_SETS:
        pass  # fetched into the user's cache (synclib.tasks.datasets); checked where it is used
    elif cfg["scenarios"] != "embedded":
        cfg["scenarios"] = resolve(cfg["scenarios"])
        d = Path(cfg["scenarios"])
        missing = [f for f in ("envs.json", "agents.json", "env_agent_combos.json") if not (d / f).is_file()]
        if not d.is_dir() or missing:
            what = "does not exist" if not d.is_dir() else f"lacks {', '.join(missing)}"
            raise ConfigError(f"{_src(flat, 'scenarios', source)}: scenarios = {str(d)!r} {what}; give 'embedded', "
                              "'sotopia' or a Sotopia-format folder (envs.json, agents.json, env_agent_combos.json)")
    _check_episodes(cfg, _src(flat, "simulate.episodes", source))
    sim = cfg["simulate"]
    try:
        check_passive_seeds(sim["passive_seeds"], sim["seeds"])
    except ValueError as exc:
        raise ConfigError(f"{_src(flat, 'simulate.passive_seeds', source)}: simulate.{exc} (simulate.seeds)") from None
    nb = cfg["notebooks"]
    if "notebooks.ability_scores" in flat:
        nb["ability_scores"] = resolve(nb["ability_scores"])
    elif nb["ability_scores"] is not None:  # the default names a file shipped in the repository
        nb["ability_scores"] = str(REPO_ROOT / nb["ability_scores"])
    if nb["ability_scores"] is not None:
        _check_ability_csv(nb["ability_scores"], _src(flat, "notebooks.ability_scores", source))
    _check_human(nb, flat, source, resolve)
    j = cfg["judge"]
    if j["mode"] is None:
        j["mode"] = "constrained" if j["url"] is None else "json"
    if j["mode"] == "constrained" and j["url"] is not None:
        raise ConfigError(f"{_src(flat, 'judge.mode', source)}: judge.mode = 'constrained' needs a local judge "
                          "(judge.url: null); a served judge uses mode 'json'")
    if cfg["cluster"] is not None:
        try:
            spec_of(cfg)
        except ClusterError as exc:
            raise ConfigError(f"{_src(flat, 'cluster', source)}: {exc}") from None
    if cfg["analysis"]["precision"] == "tf32" and str(cfg["device"]).startswith("cpu"):
        raise ConfigError(f"{_src(flat, 'analysis.precision', source)}: analysis.precision = 'tf32' needs a CUDA "
                          "device")


def _check_episodes(cfg: dict, src: str) -> None:
    """The task set holds the tasks ``simulate.episodes`` asks for (a dataset not fetched yet: checked later)."""
    if cfg["scenarios"] in datasets.TASK_SETS and not datasets.is_cached(datasets.TASK_SETS[cfg["scenarios"]]):
        return
    try:
        select_tasks(load_tasks(cfg["scenarios"]), cfg["simulate"]["episodes"])
    except ScenarioError as exc:
        raise ConfigError(f"{src}: scenarios: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{src}: simulate.episodes: {exc}") from None


def _check_human(nb: dict, flat: dict, source, resolve) -> None:
    """``notebooks.human_ratings`` and ``notebooks.human_judge_scores``: both or neither, the judge table with an
    ``episode_id`` column, the ratings checked against its episodes (:func:`synclib.judge.human.read_ratings`)."""
    # lazy: pandas, only when human ratings are checked
    from synclib.judge import JudgeError, read_ratings, read_table

    keys = ("human_ratings", "human_judge_scores")
    for k in keys:
        if nb[k] is not None:
            nb[k] = resolve(nb[k])
    given = [k for k in keys if nb[k] is not None]
    if len(given) == 1:
        other = next(k for k in keys if k not in given)
        raise ConfigError(f"{_src(flat, 'notebooks.' + given[0], source)}: notebooks.{given[0]} needs "
                          f"notebooks.{other} too")
    if not given:
        return
    try:
        table = read_table(nb["human_judge_scores"])
        if "episode_id" not in table.columns:
            raise JudgeError(f"{nb['human_judge_scores']}: no episode_id column; judge the rated episodes "
                             "file (synclib evaluate EPISODES.jsonl)")
        read_ratings(nb["human_ratings"], episode_ids=set(table["episode_id"].astype(str)))
    except (JudgeError, OSError) as exc:
        raise ConfigError(f"{_src(flat, 'notebooks.human_ratings', source)}: {exc}") from None


def _check_ability_csv(path: str, src: str) -> None:
    need = {"model", "ifeval", "musr"}
    try:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
    except OSError as exc:
        raise ConfigError(f"{src}: notebooks.ability_scores = {path!r} cannot be read: {exc.strerror}") from None
    missing = need - {h.strip().lower() for h in header}
    if missing:
        raise ConfigError(f"{src}: notebooks.ability_scores = {path!r} lacks column(s) {sorted(missing)}; "
                          "expected model,ifeval,musr")
