"""The run config's keys as data: each key's default, check, help line and step.

One :class:`Key` per setting of a run in :data:`KEYS`. Everything that checks a setting asks its key: the run
config (:func:`synclib.config.load_config`), the command-line options (:func:`synclib.cli.argtypes.setting`)
and the steps' option objects (:func:`check_setting`, e.g. ``Sampling``), so a rule and a default are written
once. The vocabularies the checks allow are imported from where they are used (reply ends, prompt formats,
stored dtypes), except those named only by their key, defined here.
"""
from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass
from typing import Any, Callable, ClassVar
from urllib.parse import urlparse

import yaml

from synclib import memory as _memory
from synclib import penalty as _penalty
from synclib.cube.schema import STORE_DTYPES
from synclib.models import PROMPT_FORMATS
from synclib.tasks.prompts import REPLY_ENDS

__all__ = ["Check", "Key", "KEYS", "STEPS", "SCHEDULING", "JUDGE_MODES", "JUDGE_LAYOUTS", "MODEL_KEYS", "lookup",
           "default", "check_setting", "Settings", "section_defaults", "keys_of_step", "invalidation_table"]

#: how the dialogs share the models (``simulate.scheduling``, :class:`~synclib.simulate.Scheduler`'s policy):
#: ``turns``, a turn's requests in batches not refilled (every dialog waits for the turn's longest reply);
#: ``continuous``, each next request joins its model's :class:`~synclib.engine.DecodeStream` as its reply ends
SCHEDULING = ("turns", "continuous")
#: how the judge asks for scores (``judge.mode``): ``constrained`` (local models: each score read from the
#: model's distribution over the allowed values) or ``json`` (a served model's JSON reply)
JUDGE_MODES = ("constrained", "json")
#: the judge's message layout (``judge.layout``): ``sotopia`` (our normalised intro, Sotopia's quoted ``Turn #t``
#: lines, newline-separated parts) or ``reference`` (the paper's code, protocol correction 14: its complete intro,
#: the agents' own dialog lines, the instructions, without separators)
JUDGE_LAYOUTS = ("sotopia", "reference")

#: the steps of the main job, in order
STEPS = ("simulate", "judge", "analyze", "notebooks", "book")

_REQUIRED = object()


# --------------------------------------------------------------------------- value checks
@dataclass(frozen=True)
class Check:
    """``fn(value)``: the normalised value, or the sentinel ``_BAD`` (``allowed`` says what is, in words)."""

    allowed: str
    fn: Callable[[Any], Any]

    def __call__(self, value):
        return self.fn(value)


_BAD = object()


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)  # numpy's integers too


def _is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


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


def int_list(lo: int = 0, nonempty: bool = True, hi: int | None = None) -> Check:
    def fn(v):
        if not isinstance(v, list) or (nonempty and not v) or \
                not all(_is_int(x) and x >= lo and (hi is None or x <= hi) for x in v):
            return _BAD
        return [int(x) for x in v] if len(set(v)) == len(v) else _BAD  # numpy's integers as Python's
    top = "" if hi is None else f" and <= {hi}"
    return Check(f"a {'non-empty ' if nonempty else ''}list of distinct integers >= {lo}{top}", fn)


def _cache_gib(v):
    try:
        return _memory.check_cache_gib(v)  # its one home
    except ValueError:
        return _BAD


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
    """One configuration key: ``path`` (``"simulate.episodes"``), ``default`` (``_REQUIRED`` for keys a config
    must give), ``check``, ``help`` (one line for the docs) and ``step``: the first step whose results it changes
    (:data:`STEPS`), or None when it changes only how a job runs (speed, memory, parallelism)."""

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
    _k("results_dir", _REQUIRED, TEXT, "where cubes, judge scores and analyses go (relative to the repository); "
       "the book's notebooks, which all results folders share, re-run for another", "notebooks"),
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
       "8 on CPU; a resumed run keeps its own, the cube attribute of that name)", "simulate"),
    _k("simulate.max_rows", None, optional(integer(1)),
       "rows per forward pass of each model (null: units_per_part); halved by a model that runs out of "
       "memory", None),
    _k("simulate.max_in_flight", None, optional(integer(1)),
       "scheduling continuous: rows a model's decoding stream holds at once (null: every dialog of the part; "
       "with kv_tokens, of the two parts in play)", None),
    _k("simulate.kv_tokens", None, optional(integer(1)),
       "scheduling continuous: key/value tokens a model's decoding rows may reserve together, each its prompt and "
       "max_new_tokens - 1 (null: no token limit); rows join in order while theirs fit", None),
    _k("simulate.cache_gib", "auto", Check(_memory.CACHE_GIB_RULE, _cache_gib),
       "memory the session caches of a pair's models may hold, GiB (auto: on the CPU a quarter of the "
       "memory available, 0.25-4 GiB; on a GPU what the device can give beyond a tenth of its memory); "
       "sessions that do not fit are recomputed: the same dialogs, more time", None),
    _k("simulate.passive", True, BOOL, "also record the passive reader (control 1)", "simulate"),
    _k("simulate.passive_own", False, BOOL, "with passive: a second reader told it is the agent it replaces (ours; "
       "the passive_own control)", "simulate"),
    _k("simulate.tom", True, BOOL, "also run the Theory-of-Mind dialogs (appendix J)", "simulate"),
    _k("simulate.tom_episodes", None, optional(integer(1)),
       "the Theory-of-Mind dialogs for the first N of the simulated tasks only (null: all)", "simulate"),
    _k("simulate.scheduling", "turns", choice(*SCHEDULING),
       "turns: a batch's dialogs advance utterance by utterance; continuous: a dialog's next "
       "utterance joins the running batch as soon as its reply ends (same dialogs up to float rounding)",
       "simulate"),
    _k("simulate.store_dtype", "float32", choice(*STORE_DTYPES),
       "precision of the stored states", "simulate"),
    _k("judge.model", _REQUIRED, TEXT, "local model spec, or the model name served at judge.url", "judge"),
    _k("judge.url", None, Check("null or an http(s) URL such as http://localhost:8000/v1", _url),
       "OpenAI-compatible endpoint; null judges with a local model (from null to a URL re-runs the judge; a "
       "moved endpoint, e.g. another node, does not)", "judge"),
    _k("judge.api_key_env", "OPENAI_API_KEY", TEXT, "environment variable holding the API key", None),
    _k("judge.mode", None, optional(choice(*JUDGE_MODES)),
       "constrained (local models) | json; null: constrained without a URL, json with one", "judge"),
    _k("judge.layout", "sotopia", choice(*JUDGE_LAYOUTS),
       "the judge's message: sotopia (Sotopia's evaluator layout) or reference (as the paper's "
       "evaluate_with_oss.py builds it)", "judge"),
    _k("judge.structured", True, BOOL,
       "HTTP judge: ask for a JSON schema (response_format) the server enforces, one object per dimension; "
       "plain JSON when the server refuses it", "judge"),
    _k("judge.reasoning_max_chars", 600, integer(1, 1999),  # llama.cpp refuses grammar repetitions of 2000+
       "HTTP judge with structured output: the longest reasoning per dimension", "judge"),
    _k("judge.concurrency", 8, integer(1), "requests in flight", None),
    _k("judge.sample", None, optional(integer(1)),
       "judge a random sample of N dialogs per ordered run, drawn with judge.sample_seed (null: every dialog)",
       "judge"),
    _k("judge.sample_seed", 0, integer(0), "seed of the judged sample (judge.sample)", "judge"),
    _k("judge.seed", 0, integer(0), "the judge's seed: sent with every HTTP request; a local judge seeds torch "
       "with it", "judge"),
    _k("judge.max_tokens", None, optional(integer(1)), "answer length limit (null: an HTTP judge sends none and "
       "the server's own applies; a local judge in json mode stops at its own)", "judge"),
    _k("judge.timeout", 300, number(0, lo_open=True), "HTTP judge: seconds to wait to connect and for each read",
       None),
    _k("judge.max_retries", 5, integer(0), "HTTP judge: retries on 429, 5xx, timeouts and dropped connections, "
       "with exponential backoff", None),
    _k("judge.batch_size", 16, integer(1), "local judge, constrained mode: rows per forward pass", None),
    _k("analysis.alpha", _penalty.PAPER_ALPHA, _penalty_check("alpha", _penalty.check_alpha_value),
       "ridge penalty: a number > 0 (the paper: 0.1), or 'cv' for episode-grouped CV "
       "per source layer", "analyze"),
    _k("analysis.cv_alphas", list(_penalty.DEFAULT_CV_ALPHAS), _penalty_check("cv_alphas", _penalty.check_alphas),
       "alpha: cv's grid, multiples of each source layer's scale", "analyze"),
    _k("analysis.cv_folds", 3, _penalty_check("cv_folds", _penalty.check_folds),
       "alpha: cv's folds (whole episodes of the training set)", "analyze"),
    _k("analysis.cv_columns", 32, _penalty_check("cv_columns", _penalty.check_columns),
       "alpha: cv's target columns per layer in the criterion (null: all)", "analyze"),
    _k("analysis.cv_seed", 0, _penalty_check("cv_seed", _penalty.check_seed), "alpha: cv's seed of folds and columns",
       "analyze"),
    _k("analysis.n_samples", 6500, optional(integer(2)), "fixed sample size per dataset (the paper: 6500; null: all)",
       "analyze"),
    _k("analysis.split_seeds", [0, 1, 2], int_list(0, hi=2**32 - 1),  # numpy's RandomState(seed), as the reference
       "train/test split seeds", "analyze"),
    _k("analysis.lags", [1, 2], int_list(1, nonempty=False), "lag controls lagJ (empty: none)", "analyze"),
    _k("analysis.pseudo_dyads", True, BOOL, "the pseudo-dyad control (ours): the partner's states from a dialog "
       "the source agent did not take part in", "analyze"),
    _k("analysis.surrogates", 99, integer(0), "surrogate partners per dialog (ours): genuine SyncR² against the "
       "distribution of dialogs that never met, each surrogate with its own penalty by the analysis' rule "
       "(synclib.analysis.surrogates); 99 lets the rank test reach p = 1/100 = 0.01; 0: none", "analyze"),
    _k("analysis.planted", 40, integer(0), "replicates of the power page's planted differences (ours): genuine "
       "against controls with a share of their targets from a surrogate partner, on re-splits of the run "
       "(synclib.analysis.planted); 0: none", "analyze"),
    _k("analysis.sample_sizes", None, optional(int_list(2)),
       "also genuine SyncR² at these sample sizes (appendix D, fig 9; null: none)", "analyze"),
    _k("analysis.persona_disjoint", True, BOOL, "also genuine SyncR² on a persona-disjoint split (table 2)",
       "analyze"),
    _k("analysis.relationship", True, BOOL, "also genuine SyncR² by relationship (fig 5, appendix G)", "analyze"),
    _k("analysis.nonlinear", True, BOOL, "also a two-layer MLP against the affine map (table 5, appendix I)",
       "analyze"),
    _k("analysis.nonlinear_epochs", 200, integer(1), "MLP training epochs (appendix I)", "analyze"),
    _k("analysis.nonlinear_batch_size", 64, optional(integer(1)), "MLP minibatch (null: full batch)", "analyze"),
    _k("analysis.nonlinear_seeds", None, optional(integer(1)),
       "fit the MLPs on the first N split seeds only (null: all)", "analyze"),
    _k("analysis.n_boot", 2000, integer(0),
       "resamples of whole episodes for the dialog-level tests of the controls (0: none)", "analyze"),
    _k("analysis.tom", True, BOOL, "also the Theory-of-Mind decoding where simulate.tom ran its dialogs "
       "(fig 11, appendix J)", "analyze"),
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


def lookup(path: str) -> Key:
    """The key ``path``, e.g. ``lookup("analysis.alpha").help``."""
    return _BY_PATH[path]


def default(path: str):
    """The default of ``path`` (a copy), e.g. ``default("analysis.alpha") == 0.1``."""
    key = _BY_PATH[path]
    if key.required:
        raise KeyError(f"{path} has no default: a config must give it")
    return copy.deepcopy(key.default)


def check_setting(owner: str | None, name: str, path: str, value):
    """``value`` of the field ``owner.name`` checked by config key ``path``'s rule: the normalised value, or a
    ValueError ``Sampling.temperature must be a number >= 0, got -1 (config key simulate.temperature)`` (with
    ``owner`` None, a command-line option's: ``must be a number >= 0, got -1``)."""
    key = _BY_PATH[path]
    out = key.check(value)
    if out is _BAD:
        if owner is None:
            raise ValueError(f"must be {key.check.allowed}, got {value!r}")
        raise ValueError(f"{owner}.{name} must be {key.check.allowed}, got {value!r} (config key {path})")
    return out


class Settings:
    """Base of the option objects (frozen dataclasses) whose fields are run-config keys (``KEYS``: field -> key),
    checked and normalised in ``__post_init__`` (``ERROR`` raised). A field's default is its key's unless the
    library's bare call means less than a run (the object's docstring says which). A field in ``UNSET`` may also
    be None, the library's "not given", where its key has no null (the analysis' ``lags``)."""

    KEYS: ClassVar[dict[str, str]] = {}
    UNSET: ClassVar[tuple[str, ...]] = ()
    ERROR: ClassVar[type[Exception]] = ValueError

    def _check(self) -> None:
        """Each field in ``KEYS`` checked by its key's rule (:func:`check_setting`)."""
        for name, path in self.KEYS.items():
            value = getattr(self, name)
            if value is None and name in self.UNSET:
                continue
            try:
                value = check_setting(type(self).__name__, name, path, _as_list(value))
            except ValueError as exc:
                raise self.ERROR(str(exc)) from None
            object.__setattr__(self, name, tuple(value) if isinstance(value, list) else value)

    def _check_own(self, **checks: Check) -> None:
        """Each field named in ``checks`` (no config key) checked by its :class:`Check`:
        ``MLPOptions.hidden must be an integer >= 1, got 0``."""
        for name, check in checks.items():
            value = check(_as_list(getattr(self, name)))
            if value is _BAD:
                raise self.ERROR(f"{type(self).__name__}.{name} must be {check.allowed}, got {getattr(self, name)!r}")
            object.__setattr__(self, name, tuple(value) if isinstance(value, list) else value)

    @classmethod
    def from_config(cls, cfg: dict, **fields):
        """The object of a run config (any dict with the keys' sections); ``fields`` give the others (or override)."""
        values = {}
        for name, path in cls.KEYS.items():
            node = cfg
            for part in path.split("."):
                node = node[part]
            values[name] = node
        return cls(**{**values, **fields})


def _as_list(value):
    """The library's tuples, ranges and 1-d arrays as the config's lists."""
    return list(value) if isinstance(value, (tuple, range)) or getattr(value, "ndim", 0) == 1 else value


def section_defaults(section: str) -> dict:
    """The defaults of one section's keys as a run config holds them: ``{"simulate": {"episodes": 40, ...}}``."""
    return {section: {k.path.split(".", 1)[1]: default(k.path) for k in KEYS if k.path.startswith(section + ".")}}


def keys_of_step(step: str) -> list[str]:
    """The keys whose change re-runs ``step`` (and what depends on it)."""
    return [k.path for k in KEYS if k.step == step]


def _inline_yaml(value) -> str:
    """``value`` as one line of YAML (``null``, ``0.7``, ``[0, 1]``, ``auto``), without PyYAML's ``...``."""
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
