"""The judge's settings, grouped in three frozen dataclasses checked once when made.

:class:`JudgeConnection`
    Which judge and how to reach it: the model, the URL of an OpenAI-compatible
    endpoint (None: a local model), the environment variable holding the API key
    (its name only: the key is read from the environment when the backend is made),
    timeouts, retries and their backoff.
:class:`JudgeSampling`
    What every request asks for: temperature, seed, answer length, structured output
    and its bound on the reasoning.  The sampling settings are part of every cache key.
:class:`JudgeOptions`
    A run: the connection, the sampling, the mode, the message layout, the task set
    whose instructions are used, concurrency, the sample of dialogs, the local judge's
    batch size and device.  :meth:`JudgeOptions.from_config` is the one mapping from a
    run config to these settings: the pipeline's judge step and ``synclib evaluate``
    both use it.

A field that is a run-config key (each class's ``KEYS``: field -> key) takes that key's
default and is checked by that key's one rule (:class:`synclib.keys.Settings`); the other
fields (timeouts, retries, the request seed, the local judge's batch) are checked here.  A bad
value raises :class:`~synclib.judge.errors.JudgeError` naming the field (and its key).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from synclib.judge.errors import JudgeError
from synclib.keys import JUDGE_MODES, Settings, default

__all__ = ["MODES", "JudgeConnection", "JudgeSampling", "JudgeOptions", "LOCAL_MAX_NEW_TOKENS"]

#: The judging modes (see :mod:`synclib.judge.evaluate`): those the key ``judge.mode`` allows.
MODES = JUDGE_MODES

#: Answer length limit of a local judge in JSON mode when ``max_tokens`` is None.
LOCAL_MAX_NEW_TOKENS = 1024

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def _bad(owner: str, name: str, allowed: str, value: Any) -> JudgeError:
    return JudgeError(f"{owner}.{name} must be {allowed}, got {value!r}")


def _check_int(owner: str, name: str, value: Any, lo: int, hi: int | None = None,
               optional: bool = False) -> None:
    if optional and value is None:
        return
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        rng = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
        raise _bad(owner, name, f"{'None or ' if optional else ''}an integer {rng}", value)


@dataclass(frozen=True)
class JudgeConnection(Settings):
    """Which judge and how to reach it.

    Parameters
    ----------
    model : str
        The served model name at ``url``, or, without ``url``, a local judge for
        :func:`synclib.models.load_model` (e.g. ``smollm2-135m``).  Also the judge id in
        tables and cache keys of an HTTP judge.
    url : str, optional
        The API root of an OpenAI-compatible endpoint, e.g. ``http://localhost:8000/v1``
        (requests go to ``{url}/chat/completions``); None: a local judge.
    api_key_env : str
        Environment variable holding the API key (read when the HTTP backend is made;
        unset or empty: no ``Authorization`` header, as a local vLLM needs none).  The
        key itself is never stored here nor written anywhere.
    timeout : float
        Seconds allowed for connecting and for each read.
    max_retries : int
        Retries after the first attempt on 429, 5xx, timeouts and dropped connections;
        other errors are not retried.
    backoff, max_backoff : float
        Wait ``min(backoff * 2**attempt, max_backoff)`` seconds before retry
        ``attempt + 1`` (a 429's ``Retry-After`` is honoured up to ``max_backoff``).
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"judge.{n}" for n in ("model", "url", "api_key_env")}
    ERROR: ClassVar[type[Exception]] = JudgeError

    model: str
    url: str | None = default("judge.url")
    api_key_env: str = default("judge.api_key_env")
    timeout: float = 300.0
    max_retries: int = 5
    backoff: float = 1.0
    max_backoff: float = 60.0

    def __post_init__(self) -> None:
        own = "JudgeConnection"
        self._check()
        if not _is_num(self.timeout) or self.timeout <= 0:
            raise _bad(own, "timeout", "a number of seconds > 0", self.timeout)
        _check_int(own, "max_retries", self.max_retries, 0)
        for name in ("backoff", "max_backoff"):
            value = getattr(self, name)
            if not _is_num(value) or value < 0:
                raise _bad(own, name, "a number of seconds >= 0", value)

    @property
    def local(self) -> bool:
        """True for a local judge (no ``url``)."""
        return self.url is None


@dataclass(frozen=True)
class JudgeSampling(Settings):
    """What every judge request asks for.

    Parameters
    ----------
    temperature : float
        Sent with every HTTP request (a local judge decodes greedily).
    seed : int
        Sent with every HTTP request; a local judge seeds torch with it.
    max_tokens : int, optional
        Answer length limit.  None: an HTTP judge sends none (the server's own limit
        applies, and a server enforcing the schema stops where the schema ends); a local
        judge stops after :data:`LOCAL_MAX_NEW_TOKENS`.
    structured : bool
        HTTP judge, JSON mode: ask for structured output (a ``json_schema``
        ``response_format``, falling back to plain JSON mode when the server refuses
        it; see :class:`~synclib.judge.backends.OpenAIBackend`).  False: plain JSON mode.
    reasoning_max_chars : int
        ``maxLength`` of every reasoning string under structured output (1 to 1999).
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"judge.{n}" for n in ("structured", "reasoning_max_chars")}
    ERROR: ClassVar[type[Exception]] = JudgeError

    temperature: float = 0.0
    seed: int = 0
    max_tokens: int | None = None
    structured: bool = default("judge.structured")
    reasoning_max_chars: int = default("judge.reasoning_max_chars")

    def __post_init__(self) -> None:
        own = "JudgeSampling"
        self._check()
        if not _is_num(self.temperature) or self.temperature < 0:
            raise _bad(own, "temperature", "a number >= 0", self.temperature)
        _check_int(own, "seed", self.seed, 0)
        _check_int(own, "max_tokens", self.max_tokens, 1, optional=True)

    @property
    def settings(self) -> dict:
        """The settings sent with an HTTP request (part of its cache key)."""
        return {"temperature": self.temperature, "seed": self.seed, "max_tokens": self.max_tokens}


_MISSING = object()


@dataclass(frozen=True)
class JudgeOptions(Settings):
    """A judging run's settings.

    Parameters
    ----------
    connection : JudgeConnection
        The judge and how to reach it.
    sampling : JudgeSampling
        What every request asks for.
    mode : ``"json"``, ``"constrained"`` or None
        None: ``json`` with ``connection.url``, ``constrained`` for a local judge
        (:attr:`judge_mode`).  ``constrained`` needs a local judge.
    layout : str
        The judge's message for a cube's dialogs: as Sotopia lays it out or as the
        paper's code did (:data:`synclib.judge.items.LAYOUTS`).
    scenarios : str or path
        The task set the dialogs were simulated from (``embedded``, ``sotopia`` or a
        directory); its ``judge_instructions.txt`` is used when it ships one.
    concurrency : int
        Requests in flight at once (HTTP judge).
    sample : int, optional
        Judge a random sample of that many dialogs, drawn with ``sample_seed``
        (:func:`~synclib.judge.items.sample_items`); None: every dialog.
    sample_seed : int
    batch_size : int
        Rows per forward pass in constrained scoring (local judge).
    device : str, optional
        Device of a local judge; None: automatic.
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"judge.{n}" for n in ("mode", "layout", "concurrency", "sample",
                                                                 "sample_seed")}
    ERROR: ClassVar[type[Exception]] = JudgeError

    connection: JudgeConnection
    sampling: JudgeSampling = field(default_factory=JudgeSampling)
    mode: str | None = default("judge.mode")
    layout: str = default("judge.layout")
    scenarios: str | os.PathLike = "embedded"
    concurrency: int = default("judge.concurrency")
    sample: int | None = default("judge.sample")
    sample_seed: int = default("judge.sample_seed")
    batch_size: int = 16
    device: str | None = None

    def __post_init__(self) -> None:
        own = "JudgeOptions"
        if not isinstance(self.connection, JudgeConnection):
            raise _bad(own, "connection", "a JudgeConnection", self.connection)
        if not isinstance(self.sampling, JudgeSampling):
            raise _bad(own, "sampling", "a JudgeSampling", self.sampling)
        self._check()
        if self.mode == "constrained" and not self.connection.local:
            raise JudgeError("JudgeOptions.mode 'constrained' needs a local judge (no judge_url): "
                             "an HTTP endpoint gives no score distributions")
        if not isinstance(self.scenarios, (str, os.PathLike)) or not str(self.scenarios):
            raise _bad(own, "scenarios", "a task set name or directory", self.scenarios)
        _check_int(own, "batch_size", self.batch_size, 1)
        if self.device is not None and (not isinstance(self.device, str) or not self.device):
            raise _bad(own, "device", "None or a device name such as cpu or cuda:0", self.device)

    @property
    def judge_mode(self) -> str:
        """The mode used: ``mode``, or by default ``json`` with a URL, else ``constrained``."""
        return self.mode or ("constrained" if self.connection.local else "json")

    @classmethod
    def from_config(cls, cfg: Mapping, **overrides) -> JudgeOptions:
        """The judge settings of a run config, ``overrides`` replacing its values.

        ``cfg`` is a run config (:func:`synclib.config.load_config`) or any part of one:
        its ``judge`` section, ``scenarios`` and ``device`` (``auto``: None) are read;
        a key it lacks keeps the field's default.  ``overrides`` name fields of this
        class or of :class:`JudgeConnection` and :class:`JudgeSampling` (``timeout=5``,
        ``seed=1``...), e.g. the options of ``synclib evaluate``.
        """
        values: dict[str, Any] = {}
        for path, name in _config_fields().items():
            node: Any = cfg
            for part in path.split("."):
                node = node.get(part, _MISSING) if isinstance(node, Mapping) else _MISSING
            if node is not _MISSING:
                values[name] = node
        if values.get("device") == "auto":
            values["device"] = None
        values.update(overrides)
        parts: dict[type, dict[str, Any]] = {JudgeConnection: {}, JudgeSampling: {}, cls: {}}
        for name, value in values.items():
            owner = next((c for c in parts if name in {f.name for f in dataclasses.fields(c)}), None)
            if owner is None or name in ("connection", "sampling"):
                raise JudgeError(f"JudgeOptions.from_config: no judge setting {name!r}")
            parts[owner][name] = value
        if "model" not in parts[JudgeConnection]:
            raise JudgeError("JudgeOptions.from_config: the judge model is missing (judge.model, "
                             "--judge-model)")
        return cls(connection=JudgeConnection(**parts[JudgeConnection]),
                   sampling=JudgeSampling(**parts[JudgeSampling]), **parts[cls])


def _config_fields() -> dict[str, str]:
    """Run-config key -> judge setting: the three classes' ``KEYS``, and ``scenarios`` and
    ``device`` (``auto``: None); the one mapping from a run config to the judge's settings."""
    out = {path: name for c in (JudgeConnection, JudgeSampling, JudgeOptions) for name, path in c.KEYS.items()}
    return {**out, "scenarios": "scenarios", "device": "device"}
