"""The settings of one :func:`synclib.simulate.simulate` call, in small frozen groups.

Each group's fields are run-config keys (its ``KEYS``: field -> key), checked when the group is made
(:func:`synclib.keys.check_setting`), an error naming both (e.g. ``Sampling.temperature must be a number >= 0, got
-1 (config key simulate.temperature)``).  ``from_config`` makes a group from a run config, the one mapping that
``synclib run`` and ``synclib simulate`` share.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, Sequence

from synclib.cube import CubeWriter
from synclib.keys import Settings, check_setting, default

__all__ = ["Sampling", "Passes", "Batching", "RunOptions", "resolve_sampling", "default_units_per_part"]


@dataclass(frozen=True)
class Sampling(Settings):
    """How every reply is sampled and where it ends.

    Attributes
    ----------
    temperature : float, default 0.7 (0: greedy)
    max_new_tokens : int, default 300, per utterance
    top_k, top_p : "model", None or a number
        Sampling filters per :func:`resolve_sampling` (default: each model's own, as ``transformers``' ``generate``).
    stop_at_first_line : bool, default True
        Stop a reply at its first complete line (only that line is kept).
    reply_end : {"line", "sentence"}, default "line"
        A reply cut by ``max_new_tokens``: kept (the reference), or cut back to its last
        complete sentence where it has one (:func:`synclib.tasks.prompts.trim_to_sentence`).
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"simulate.{n}" for n in (
        "temperature", "max_new_tokens", "top_k", "top_p", "stop_at_first_line", "reply_end")}

    temperature: float = default("simulate.temperature")
    max_new_tokens: int = default("simulate.max_new_tokens")
    top_k: object = default("simulate.top_k")
    top_p: object = default("simulate.top_p")
    stop_at_first_line: bool = default("simulate.stop_at_first_line")
    reply_end: str = default("simulate.reply_end")

    def __post_init__(self):
        self._check()

    def for_model(self, lm) -> "Sampling":
        """These settings with ``top_k`` / ``top_p`` resolved for ``lm`` (:func:`resolve_sampling`; None: off)."""
        return replace(self, **resolve_sampling(lm, self.top_k, self.top_p))

    @property
    def filters(self) -> dict:
        """``{"top_k", "top_p"}`` as :meth:`synclib.engine.Engine.generate` takes them (resolved ones)."""
        if "model" in (self.top_k, self.top_p):
            raise ValueError("Sampling.top_k/top_p: 'model' must be resolved first (Sampling.for_model)")
        return {"top_k": self.top_k, "top_p": self.top_p}


@dataclass(frozen=True)
class Passes(Settings):
    """The optional passes after (or beside) the genuine dialogs.

    Attributes
    ----------
    passive : bool, default False
        Re-read the genuine dialogs as a passive reader (``hidden_*_passive``; the run config's default is on).
    passive_seeds : tuple of int, optional
        The seeds the passive reader reads (default: every simulated seed; the paper: 0-2).
    passive_own : bool, default False
        With ``passive``: a second reader of the same dialogs, told it is the agent it replaces
        (``hidden_*_passive_own``; ours), so that its gap to genuine measures taking part alone.
    taskset : TaskSet, optional
        The set the passive reader's persona is drawn from (:func:`synclib.tasks.prompts.passive_persona`); default
        the simulated tasks when they are a TaskSet.  Without one the reader is told it is the agent it replaces.
    tom : bool, default False
        Run the Theory-of-Mind dialogs (``*_tom``, ``emotion_*``, ``action_*``; the run config's default is on).
    tom_episodes : int, optional
        With ``tom``: the ToM dialogs of the first this many tasks only (all their seeds); the other units' ToM
        variables stay unreached.  Default: every task.
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"simulate.{n}" for n in ("passive", "passive_seeds", "passive_own", "tom",
                                                               "tom_episodes")}

    passive: bool = False
    passive_seeds: tuple | None = default("simulate.passive_seeds")
    passive_own: bool = False
    taskset: object = field(default=None, compare=False)
    tom: bool = False
    tom_episodes: int | None = default("simulate.tom_episodes")

    def __post_init__(self):
        self._check()


@dataclass(frozen=True)
class Batching(Settings):
    """How a simulation's dialogs share the models; each knob has one meaning.

    Attributes
    ----------
    units_per_part : int, optional
        (episode, seed) units played together and written as one crash-safe cube part; a resumed run keeps its own
        (the cube attribute of that name).  Default: the unfinished run's value when resuming, else
        :func:`default_units_per_part`.
    max_rows : int, optional
        Rows per forward pass of each engine (``Engine(max_rows=max_rows)``); an engine that runs out of memory
        halves its own copy.  Default: ``units_per_part``.
    max_in_flight : int, optional
        With ``scheduling="continuous"``: rows a decoding stream holds at once (its capacity); a new dialog starts
        only while agent 1's stream holds fewer, queued or decoding.  Default: the dialogs (genuine and ToM) of the
        largest part; with ``kv_tokens``, of the two largest, so that the token budget alone sets how many decode.
    kv_tokens : int, optional
        With ``scheduling="continuous"``: key/value tokens a model's decoding rows may reserve together (the
        stream's ``kv_tokens``), so more short dialogs than long ones are in flight.  Default: no limit.
    scheduling : {"turns", "continuous"}, default "turns"
        How a part's dialogs share the models (:data:`synclib.keys.SCHEDULING`): the
        :class:`~synclib.simulate.Scheduler`'s policy and whether the streams are refilled.
    cache_gib : "auto" or number, default "auto"
        Memory the session caches of both models may hold together, in GiB (:func:`synclib.memory.session_budget`).
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"simulate.{n}" for n in (
        "units_per_part", "max_rows", "max_in_flight", "kv_tokens", "scheduling", "cache_gib")}

    units_per_part: int | None = default("simulate.units_per_part")
    max_rows: int | None = default("simulate.max_rows")
    max_in_flight: int | None = default("simulate.max_in_flight")
    kv_tokens: int | None = default("simulate.kv_tokens")
    scheduling: str = default("simulate.scheduling")
    cache_gib: object = default("simulate.cache_gib")

    def __post_init__(self):
        self._check()

    def resolve(self, out: Path, device) -> "Batching":
        """These knobs with ``units_per_part`` (from an unfinished run at ``out``, else :func:`default_units_per_part`
        of ``device``) and ``max_rows`` filled in."""
        units = self.units_per_part
        if units is None:
            old = CubeWriter.existing_spec(out)
            attrs = (old or {}).get("attrs", {})
            units = int(attrs["units_per_part"]) if "units_per_part" in attrs else default_units_per_part(device)
        rows = self.max_rows or units
        return replace(self, units_per_part=units, max_rows=rows)

    def stream_capacity(self, part_dialogs: Sequence[int]) -> int:
        """A continuous stream's capacity (``max_in_flight`` or its default) for parts of ``part_dialogs`` dialogs."""
        if self.max_in_flight:
            return self.max_in_flight
        sizes = sorted(part_dialogs, reverse=True)
        return sum(sizes[:2 if self.kv_tokens else 1])


@dataclass(frozen=True)
class RunOptions(Settings):
    """Where and how a simulation runs and what it reports.

    Attributes
    ----------
    device, dtype : passed to :func:`synclib.models.load_model` for model specs.
    prompt_formats : (str, str)
        Prompt formats of A and B when given as specs (:data:`synclib.models.PROMPT_FORMATS`).
    store_dtype : {"float32", "float16", "bfloat16"}
        Precision of the stored states.
    overwrite : bool
        Replace a finished cube at ``out`` (otherwise it is returned untouched).
    progress : bool
        A tqdm bar on stderr where it is a terminal.
    engine_stats : dict, optional
        Filled with the call's engine counters and wall seconds (see :func:`synclib.simulate.simulate`).
    sync_timing : bool
        ``Engine.sync_timing``: the seconds count GPU work where it was launched.
    """

    device: object = None
    dtype: object = None
    prompt_formats: tuple = ("chat_template", "chat_template")
    KEYS: ClassVar[dict[str, str]] = {"store_dtype": "simulate.store_dtype"}

    store_dtype: str = default("simulate.store_dtype")
    overwrite: bool = False
    progress: bool = True
    engine_stats: dict | None = field(default=None, compare=False)
    sync_timing: bool = False

    def __post_init__(self):
        self._check()
        if len(tuple(self.prompt_formats)) != 2:
            raise ValueError(f"RunOptions.prompt_formats must be two formats (A, B), got {self.prompt_formats!r}")
        if self.engine_stats is not None and not isinstance(self.engine_stats, dict):
            raise ValueError(f"RunOptions.engine_stats must be None or a dict, got {type(self.engine_stats).__name__}")


def default_units_per_part(device) -> int:
    """(episode, seed) units per part when none is given: 64 on CUDA, 8 on CPU."""
    return 64 if str(device).startswith("cuda") else 8


def resolve_sampling(lm, top_k="model", top_p="model") -> dict:
    """The top-k / top-p a model samples with, ``{"top_k": int or None, "top_p": float or None}`` for
    :meth:`synclib.engine.Engine.generate`: ``"model"`` takes the model's own ``generation_config``
    (:func:`synclib.models.sampling_settings`, transformers' defaults where it sets none), None switches the filter
    off, a number is used as it is."""
    own = getattr(lm, "generation_defaults", None) or {"top_k": 50, "top_p": 1.0}
    # each by its key's rule (simulate.top_k / top_p), the model's own values too
    k, p = (check_setting("Sampling" if v != "model" else "the model's generation_config", name,
                          f"simulate.{name}", own.get(name) if v == "model" else v)
            for name, v in (("top_k", top_k), ("top_p", top_p)))
    return {"top_k": None if not k else int(k), "top_p": None if p is None or float(p) >= 1 else float(p)}
