"""The run configuration: one schema holds every key, its type, range, default and step.

A run config is a YAML file (``config/default.yaml`` and friends) plus ``--set KEY=VALUE``
overrides.  :func:`load_config` reads both, refuses any mistake before work starts (an
unknown key names the closest valid one; a bad value names the key, the value and what is
allowed; every message names the file or override it came from) and returns a plain,
complete ``dict``.  The library and the command line read their defaults from here
(:func:`default`), so a default is written once.

Each key also says which step of the main job it feeds (:attr:`Key.step`): changing it
re-runs that step's jobs and what depends on them, nothing upstream; keys with no step
(how fast or how wide a job runs) re-run nothing.  ``book/reproduce.md`` shows the table
(:func:`invalidation_table`).
"""
from __future__ import annotations

import copy
import csv
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

import yaml

from synclib import penalty as _penalty
from synclib.cluster import ClusterError, spec_of
from synclib.engine import SCHEDULING
from synclib.models import PROMPT_FORMATS
from synclib.paths import DEFAULT_CONFIG, REPO_ROOT
from synclib.tasks import datasets
from synclib.tasks.datasets import TASK_SETS
from synclib.tasks.prompts import REPLY_ENDS
from synclib.tasks.scenarios import ScenarioError, load_tasks, select_tasks

__all__ = ["ConfigError", "Key", "KEYS", "STEPS", "load_config", "validate_config", "default",
           "keys_of_step", "invalidation_table", "MODEL_KEYS"]

#: the steps of the main job, in order
STEPS = ("simulate", "judge", "analyze", "notebooks", "book")

_REQUIRED = object()


class ConfigError(ValueError):
    """A run configuration is invalid; the message names the file or override and the key."""


# --------------------------------------------------------------------------- value checks
@dataclass(frozen=True)
class Check:
    """A value check: ``fn(value)`` returns the normalised value or None if invalid."""

    allowed: str
    fn: Callable[[Any], Any]

    def __call__(self, value):
        return self.fn(value)


_BAD = object()


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    rng = " and ".join(x for x in (f">= {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else "") if x)
    return Check(f"an integer{' ' + rng if rng else ''}",
                 lambda v: v if _is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi) else _BAD)


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Check:
    parts = ([f"{'>' if lo_open else '>='} {lo}"] if lo is not None else []) + ([f"<= {hi}"] if hi is not None else [])

    def fn(v):
        if not _is_num(v) or v != v:
            return _BAD
        if lo is not None and (v <= lo if lo_open else v < lo) or hi is not None and v > hi:
            return _BAD
        return v
    return Check(f"a number {' and '.join(parts)}".strip(), fn)


BOOL = Check("true or false", lambda v: v if isinstance(v, bool) else _BAD)
TEXT = Check("a non-empty string", lambda v: v if isinstance(v, str) and v.strip() else _BAD)


def choice(*options) -> Check:
    return Check("one of " + ", ".join(repr(o) for o in options), lambda v: v if v in options else _BAD)


def optional(check: Check) -> Check:
    return Check(f"null or {check.allowed}", lambda v: None if v is None else check(v))


def int_list(lo: int = 0, nonempty: bool = True) -> Check:
    def fn(v):
        if not isinstance(v, list) or (nonempty and not v) or not all(_is_int(x) and x >= lo for x in v):
            return _BAD
        return v if len(set(v)) == len(v) else _BAD
    return Check(f"a {'non-empty ' if nonempty else ''}list of distinct integers >= {lo}", fn)


def _cache_gib(v):
    return v if v == "auto" or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0) else _BAD


def _episodes(v):
    if _is_int(v):
        return v if v >= 1 else _BAD
    return int_list(0)(v)


def _penalty_check(field: str, fn: Callable) -> Check:
    """A check of the ridge penalty's ``field`` by :mod:`synclib.penalty` (its one home)."""
    def check(v):
        try:
            out = fn(v)
        except ValueError:
            return _BAD
        return list(out) if isinstance(out, tuple) else out
    return Check(_penalty.FIELD_RULES[field], check)


def _url(v):
    if v is None:
        return None
    if not isinstance(v, str):
        return _BAD
    u = urlparse(v)
    return v if u.scheme in ("http", "https") and u.netloc else _BAD


def _pairs(v):
    if not isinstance(v, list) or not v or not all(isinstance(p, str) and p.count("-") >= 1 for p in v):
        return _BAD
    return [str(p) for p in v]


def _mapping(v):
    return v if isinstance(v, dict) else _BAD


def _top_k(v):
    return v if v is None or v == "model" or (_is_int(v) and v >= 0) else _BAD


def _top_p(v):
    return v if v is None or v == "model" or (_is_num(v) and 0 < v <= 1) else _BAD


# --------------------------------------------------------------------------- the schema
@dataclass(frozen=True)
class Key:
    """One configuration key.

    Attributes
    ----------
    path : dotted key, e.g. ``"simulate.episodes"``
    default : its default (``_REQUIRED`` for keys a config must give)
    check : :class:`Check`
    help : one line for the docs
    step : the first step whose results it changes (:data:`STEPS`), or None when it changes
        only how a job runs (speed, memory, parallelism), not what it finds
    """

    path: str
    default: Any
    check: Check
    help: str
    step: str | None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def _k(path, default, check, help_, step):
    return Key(path, default, check, help_, step)


KEYS: tuple[Key, ...] = (
    _k("name", "run", TEXT, "the run's name, shown in the book", "notebooks"),
    _k("results_dir", _REQUIRED, TEXT, "where cubes, judge scores and analyses go (relative to the repository)", None),
    _k("scenarios", _REQUIRED, TEXT, "'embedded', 'sotopia' (the paper's 450 tasks, fetched into your cache: "
       "`synclib fetch sotopia`) or a Sotopia-format task folder (envs.json, agents.json, env_agent_combos.json)",
       "simulate"),
    _k("device", "auto", TEXT, "auto | cpu | cuda | cuda:N", None),
    _k("dtype", "auto", choice("auto", "float32", "bfloat16", "float16"),
       "model weights: auto (bf16 on CUDA and on CPUs with native bf16 matrix products, else float32) | "
       "float32 | bfloat16 | float16", "simulate"),
    _k("models", _REQUIRED, Check("a mapping of short keys to models", _mapping),
       "short key -> {spec, family, label}", "simulate"),
    _k("pairs", _REQUIRED, Check("a non-empty list of 'A-B' model-key pairs", _pairs),
       "model pairs A-B (A plays agent 1)", "simulate"),
    _k("orders", "both", choice("both", "first"),
       "both: a pair of two different models plays in both speaking orders (A-B and B-A, as the paper); "
       "first: only as written (half the simulations)", "simulate"),
    _k("simulate.episodes", 40, Check("a positive integer (the first N tasks) or a list of task indices", _episodes),
       "the first N tasks of the scenario set, or a list of task indices", "simulate"),
    _k("simulate.seeds", [0], int_list(0), "simulation seeds", "simulate"),
    _k("simulate.max_utterances", 16, integer(1), "utterances per episode, both agents (the paper: 16)", "simulate"),
    _k("simulate.max_new_tokens", 300, integer(1), "new tokens per utterance (the paper: 300)", "simulate"),
    _k("simulate.temperature", 0.7, number(0), "sampling temperature; 0 is greedy", "simulate"),
    _k("simulate.top_k", "model", Check("'model', an integer >= 0 or null", _top_k),
       "keep the k most likely tokens; 'model': as transformers' generate with the model's "
       "generation_config (top-k 50 unless the checkpoint sets one), as the paper's code", "simulate"),
    _k("simulate.top_p", "model", Check("'model', a number in (0, 1] or null", _top_p),
       "nucleus sampling; 'model': the checkpoint's generation_config top_p (0.9 for the Llama "
       "chat models), none where it sets none", "simulate"),
    _k("simulate.stop_at_first_line", True, BOOL,
       "stop a reply at its first line break (only the first line is kept; see the method page)", "simulate"),
    _k("simulate.reply_end", "line", choice(*REPLY_ENDS),
       "a reply that reaches max_new_tokens mid-line: 'line' keeps it as generated (the reference), "
       "'sentence' cuts it back to its last complete sentence where it has one (ours; the same tokens)",
       "simulate"),
    _k("simulate.passive_seeds", None, optional(int_list(0)),
       "simulation seeds the passive reader reads (null: all; the paper: 0-2)", "simulate"),
    _k("simulate.units_per_part", None, optional(integer(1)),
       "episode x seed units played together and written as one crash-safe cube part (null: 64 on CUDA, "
       "8 on CPU; a resumed run keeps its own; the cube attribute batch_size)", "simulate"),
    _k("simulate.max_rows", None, optional(integer(1)),
       "rows per forward pass of each model (null: units_per_part); halved by a model that runs out of "
       "memory", None),
    _k("simulate.max_in_flight", None, optional(integer(1)),
       "scheduling continuous: rows a model's decoding stream holds at once (null: every dialog of the part; "
       "with kv_tokens, of the two parts in play)", None),
    _k("simulate.kv_tokens", None, optional(integer(1)),
       "scheduling continuous: key/value tokens a model's decoding rows may reserve together, each its prompt and "
       "max_new_tokens - 1 (null: no token limit); rows join in order while theirs fit", None),
    _k("simulate.cache_gib", "auto", Check("'auto' or a number >= 0", _cache_gib),
       "memory the session caches of a pair's models may hold, GiB (auto: on the CPU a quarter of the "
       "memory available, 0.25-4 GiB; on a GPU what the device can give beyond a tenth of its memory); "
       "sessions that do not fit are recomputed: the same dialogs, more time", None),
    _k("simulate.passive", True, BOOL, "also record the passive reader (control 1)", "simulate"),
    _k("simulate.tom", True, BOOL, "also run the Theory-of-Mind dialogs (appendix J)", "simulate"),
    _k("simulate.tom_episodes", None, optional(integer(1)),
       "the Theory-of-Mind dialogs for the first N of the simulated tasks only (null: all)", "simulate"),
    _k("simulate.scheduling", "turns", choice(*SCHEDULING),
       "turns: a batch's dialogs advance utterance by utterance; continuous: a dialog's next "
       "utterance joins the running batch as soon as its reply ends (same dialogs up to float rounding)",
       "simulate"),
    _k("simulate.store_dtype", "float32", choice("float32", "float16", "bfloat16"),
       "precision of the stored states", "simulate"),
    _k("judge.model", _REQUIRED, TEXT, "local model spec, or the model name served at judge.url", "judge"),
    _k("judge.url", None, Check("null or an http(s) URL such as http://localhost:8000/v1", _url),
       "OpenAI-compatible endpoint; null judges with a local model (from null to a URL re-runs the judge; a "
       "moved endpoint, e.g. another node, does not)", "judge"),
    _k("judge.api_key_env", "OPENAI_API_KEY", TEXT, "environment variable holding the API key", None),
    _k("judge.mode", None, optional(choice("constrained", "json")),
       "constrained (local models) | json; null: constrained without a URL, json with one", "judge"),
    _k("judge.layout", "sotopia", choice("sotopia", "reference"),
       "the judge's message: sotopia (Sotopia's evaluator layout) or reference (as the paper's "
       "evaluate_with_oss.py builds it)", "judge"),
    _k("judge.structured", True, BOOL,
       "HTTP judge: ask for a JSON schema (response_format) the server enforces, one object per dimension; "
       "plain JSON when the server refuses it", "judge"),
    _k("judge.reasoning_max_chars", 600, integer(1, 1999),
       "HTTP judge with structured output: the longest reasoning per dimension", "judge"),
    _k("judge.concurrency", 8, integer(1), "requests in flight", None),
    _k("judge.sample", None, optional(integer(1)),
       "judge a random sample of N dialogs per ordered run, drawn with judge.sample_seed (null: every dialog)",
       "judge"),
    _k("judge.sample_seed", 0, integer(0), "seed of the judged sample (judge.sample)", "judge"),
    _k("analysis.alpha", _penalty.PAPER_ALPHA, _penalty_check("alpha", _penalty.check_alpha_value),
       "ridge penalty, or 'cv'", "analyze"),
    _k("analysis.cv_alphas", list(_penalty.DEFAULT_CV_ALPHAS), _penalty_check("alphas", _penalty.check_alphas),
       "alpha: cv's grid, multiples of each source layer's scale", "analyze"),
    _k("analysis.cv_folds", 3, _penalty_check("folds", _penalty.check_folds),
       "alpha: cv's folds (whole episodes of the training set)", "analyze"),
    _k("analysis.cv_columns", 32, _penalty_check("columns", _penalty.check_columns),
       "alpha: cv's target columns per layer in the criterion (null: all)", "analyze"),
    _k("analysis.cv_seed", 0, _penalty_check("seed", _penalty.check_seed), "alpha: cv's seed of folds and columns",
       "analyze"),
    _k("analysis.n_samples", 6500, optional(integer(2)), "samples per dataset (null: all)", "analyze"),
    _k("analysis.split_seeds", [0, 1, 2], int_list(0), "train/test split seeds", "analyze"),
    _k("analysis.lags", [1, 2], int_list(1, nonempty=False), "lag controls", "analyze"),
    _k("analysis.pseudo_dyads", True, BOOL, "the pseudo-dyad control (ours): the partner's states from a dialog "
       "the source agent did not take part in", "analyze"),
    _k("analysis.surrogates", 99, integer(0), "surrogate partners per dialog (ours): genuine SyncR² against the "
       "distribution of dialogs that never met, each surrogate with its own penalty by the analysis' rule "
       "(synclib.analysis.surrogates); 99 lets the rank test reach p = 1/100 = 0.01; 0: none", "analyze"),
    _k("analysis.planted", 40, integer(0), "replicates of the power page's planted differences (ours): genuine "
       "against controls with a share of their targets from a surrogate partner, on re-splits of the run "
       "(synclib.analysis.planted); 0: none", "analyze"),
    _k("analysis.sample_sizes", None, optional(int_list(2)), "appendix D sample sizes (fig 9)", "analyze"),
    _k("analysis.persona_disjoint", True, BOOL, "table 2", "analyze"),
    _k("analysis.relationship", True, BOOL, "fig 5 (appendix G)", "analyze"),
    _k("analysis.nonlinear", True, BOOL, "table 5 (appendix I)", "analyze"),
    _k("analysis.nonlinear_epochs", 200, integer(1), "MLP training epochs (appendix I)", "analyze"),
    _k("analysis.nonlinear_batch_size", 64, optional(integer(1)), "MLP minibatch (null: full batch)", "analyze"),
    _k("analysis.nonlinear_seeds", None, optional(integer(1)),
       "fit the MLPs on the first N split seeds only (null: all)", "analyze"),
    _k("analysis.n_boot", 2000, integer(0),
       "resamples of whole episodes for the dialog-level tests of the controls (0: none)", "analyze"),
    _k("analysis.tom", True, BOOL, "fig 11 (appendix J)", "analyze"),
    _k("analysis.tom_format_filter", True, BOOL,
       "fig 11: drop samples whose target reply did not follow the 'Emotion. Action type.' format "
       "(the protocol); false uses every sample, for models that never follow it", "analyze"),
    _k("analysis.precision", "float32", choice("float32", "tf32", "bf16"),
       "precision of the ridge grid's big products (tf32: CUDA only)", "analyze"),
    _k("analysis.max_resident_gib", 2, number(0), "hidden variables up to this size are loaded whole; "
       "larger ones stream from disk", None),
    _k("notebooks.ability_scores", "data/ability_scores.csv", optional(TEXT),
       "CSV of per-model IFEval / MuSR scores (table 1); the default holds the paper's code's scores of its six models",
       "notebooks"),
    _k("notebooks.human_ratings", None, optional(TEXT),
       "CSV of human Sotopia-eval ratings (episode_id,agent,dimension,score[,rater]) for table 4 and "
       "fig 10; needs notebooks.human_judge_scores", "notebooks"),
    _k("notebooks.human_judge_scores", None, optional(TEXT),
       "the judge's table of the rated episodes (synclib evaluate EPISODES.jsonl writes it)", "notebooks"),
    _k("cluster", None, optional(Check("a mapping", _mapping)),
       "a Dask cluster: {scheduler: tcp://HOST:8786}, or {type: slurm|pbs|sge|lsf|local, jobs, walltime, ...} for "
       "dask-jobqueue (synclib.cluster: one worker process and one GPU per job, workers leaving before the walltime, "
       "jobs replaced as they end)", None),
)

_BY_PATH = {k.path: k for k in KEYS}
#: keys of one ``models`` entry
MODEL_KEYS = {"spec": TEXT, "family": TEXT, "label": TEXT,
              "prompt_format": choice(*PROMPT_FORMATS)}
_SECTIONS = {p.split(".")[0] for p in _BY_PATH if "." in p}


def default(path: str):
    """The default of ``path`` (a copy), e.g. ``default("analysis.alpha") == 0.1``."""
    key = _BY_PATH[path]
    if key.required:
        raise KeyError(f"{path} has no default: a config must give it")
    return copy.deepcopy(key.default)


def keys_of_step(step: str) -> list[str]:
    """The keys whose change re-runs ``step`` (and what depends on it)."""
    return [k.path for k in KEYS if k.step == step]


def _inline_yaml(value) -> str:
    """``value`` as one line of YAML (``null``, ``0.7``, ``[0, 1]``, ``auto``), without the
    document-end marker ``...`` that PyYAML writes after a bare scalar."""
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    if text.endswith("\n..."):
        text = text[:-4]
    elif text.endswith("..."):
        text = text[:-3]
    return text.strip().replace("\n", " ")


def invalidation_table() -> str:
    """Markdown: which settings re-run which step (for ``book/reproduce.md``)."""
    rows = ["| setting | re-runs from | default |", "| --- | --- | --- |"]
    for k in KEYS:
        d = "(required)" if k.required else f"`{_inline_yaml(k.default)}`"
        rows.append(f"| `{k.path}` | {k.step or 'nothing (speed or memory only)'} | {d.replace(chr(10), ' ')} |")
    rows.append("| `models.<key>.spec`, `.prompt_format` | simulate | `chat_template` (prompt_format) |")
    rows.append("| `models.<key>.family`, `.label` | notebooks | the key, the spec |")
    return "\n".join(rows)


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
    """Read a YAML run config, apply ``KEY=VALUE`` overrides and validate it (nothing runs).

    Relative paths (``results_dir``, ``scenarios``, the ``notebooks.*`` files) are
    resolved against the repository root when the file lies in the repository, else
    against the file's folder.

    Raises
    ------
    ConfigError
        naming the file or override, the key, the value and what is allowed.
    """
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
    """Check every key and cross-reference; fill defaults; resolve paths.  Returns a new dict.

    ``origin`` maps dotted keys to the override that set them (for messages).
    """
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
    if sim["passive_seeds"] is not None and not set(sim["passive_seeds"]) <= set(sim["seeds"]):
        extra = sorted(set(sim["passive_seeds"]) - set(sim["seeds"]))
        raise ConfigError(f"{_src(flat, 'simulate.passive_seeds', source)}: simulate.passive_seeds names seed(s) "
                          f"{extra} that simulate.seeds = {sim['seeds']} does not simulate")
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
    """The task set loads and holds the tasks ``simulate.episodes`` asks for (a dataset not
    fetched yet is checked once ``synclib run`` has fetched it)."""
    if cfg["scenarios"] in datasets.TASK_SETS and not datasets.is_cached(datasets.TASK_SETS[cfg["scenarios"]]):
        return
    try:
        select_tasks(load_tasks(cfg["scenarios"]), cfg["simulate"]["episodes"])
    except ScenarioError as exc:
        raise ConfigError(f"{src}: scenarios: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{src}: simulate.episodes: {exc}") from None


def _check_human(nb: dict, flat: dict, source, resolve) -> None:
    """``notebooks.human_ratings`` and ``notebooks.human_judge_scores``: both or neither,
    the judge table readable with an ``episode_id`` column, the ratings checked line by
    line against its episodes (:func:`synclib.judge.human.read_ratings`)."""
    # lazy: pandas (through synclib.judge) only when human ratings are checked (synclib.config stays light)
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
