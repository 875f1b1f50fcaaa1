"""The judge's settings, three frozen dataclasses checked once when made: :class:`JudgeConnection` (which judge
and how to reach it), :class:`JudgeSampling` (what every request asks for; part of every cache key) and
:class:`JudgeOptions` (a run; :meth:`JudgeOptions.from_config` is the one mapping from a run config).

A field that is a run-config key (each class's ``KEYS``: field -> ``judge.<field>``) takes that key's default
and rule (:class:`synclib.keys.Settings`); a bad value raises :class:`~synclib.judge.errors.JudgeError` naming
the field and its key.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from synclib.judge.errors import JudgeError
from synclib.keys import JUDGE_MODES, Settings, default, number

__all__ = ["MODES", "JudgeConnection", "JudgeSampling", "JudgeOptions", "LOCAL_MAX_NEW_TOKENS"]

#: The judging modes (:mod:`synclib.judge.evaluate`), as the key ``judge.mode`` allows.
MODES = JUDGE_MODES

#: Answer length limit of a local judge in JSON mode when ``max_tokens`` is None.
LOCAL_MAX_NEW_TOKENS = 1024


def _bad(owner: str, name: str, allowed: str, value: Any) -> JudgeError:
    return JudgeError(f"{owner}.{name} must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class JudgeConnection(Settings):
    """Which judge and how to reach it.

    Parameters
    ----------
    model : str
        The served model at ``url`` (the judge id in tables and cache keys), or, without ``url``, a local judge
        for :func:`synclib.models.load_model` (e.g. ``smollm2-135m``).
    url : str, optional
        The API root of an OpenAI-compatible endpoint, e.g. ``http://localhost:8000/v1``; None: a local judge.
    api_key_env : str
        Environment variable holding the API key, read when the HTTP backend is made (unset or empty: no
        ``Authorization`` header).  The key itself is never stored here.
    timeout : float
        Seconds allowed for connecting and for each read.
    max_retries : int
        Retries after the first attempt on retryable HTTP statuses, timeouts and dropped connections.
    backoff, max_backoff : float
        Wait ``min(backoff * 2**attempt, max_backoff)`` seconds before retry ``attempt + 1``.
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"judge.{n}" for n in ("model", "url", "api_key_env", "timeout",
                                                                 "max_retries")}
    ERROR: ClassVar[type[Exception]] = JudgeError

    model: str
    url: str | None = default("judge.url")
    api_key_env: str = default("judge.api_key_env")
    timeout: float = default("judge.timeout")
    max_retries: int = default("judge.max_retries")
    backoff: float = 1.0
    max_backoff: float = 60.0

    def __post_init__(self) -> None:
        self._check()
        self._check_own(backoff=number(0), max_backoff=number(0))

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
        Answer length limit.  None: an HTTP judge sends none (the server's limit applies); a local judge stops
        after :data:`LOCAL_MAX_NEW_TOKENS`.
    structured : bool
        HTTP judge, JSON mode: ask for structured output (:class:`~synclib.judge.backends.OpenAIBackend`).
    reasoning_max_chars : int
        ``maxLength`` of every reasoning string under structured output (1 to 1999).
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"judge.{n}" for n in ("seed", "max_tokens", "structured",
                                                                 "reasoning_max_chars")}
    ERROR: ClassVar[type[Exception]] = JudgeError

    temperature: float = 0.0
    seed: int = default("judge.seed")
    max_tokens: int | None = default("judge.max_tokens")
    structured: bool = default("judge.structured")
    reasoning_max_chars: int = default("judge.reasoning_max_chars")

    def __post_init__(self) -> None:
        self._check()
        self._check_own(temperature=number(0))

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
    sampling : JudgeSampling
    mode : ``"json"``, ``"constrained"`` or None
        None: ``json`` with ``connection.url``, else ``constrained`` (:attr:`judge_mode`), which needs a local judge.
    layout : str
        The message layout for a cube's dialogs (:data:`synclib.judge.items.LAYOUTS`).
    scenarios : str or path
        The dialogs' task set (``embedded``, ``sotopia`` or a directory); its ``judge_instructions.txt`` is used
        when it ships one.
    concurrency : int
        Requests in flight at once (HTTP judge).
    sample : int, optional
        Judge a random sample of that many dialogs, drawn with ``sample_seed``; None: every dialog.
    sample_seed : int
    batch_size : int
        Rows per forward pass in constrained scoring (local judge).
    device : str, optional
        Device of a local judge; None: automatic.
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"judge.{n}" for n in ("mode", "layout", "concurrency", "sample",
                                                                 "sample_seed", "batch_size")}
    ERROR: ClassVar[type[Exception]] = JudgeError

    connection: JudgeConnection
    sampling: JudgeSampling = field(default_factory=JudgeSampling)
    mode: str | None = default("judge.mode")
    layout: str = default("judge.layout")
    scenarios: str | os.PathLike = "embedded"
    concurrency: int = default("judge.concurrency")
    sample: int | None = default("judge.sample")
    sample_seed: int = default("judge.sample_seed")
    batch_size: int = default("judge.batch_size")
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
        if self.device is not None and (not isinstance(self.device, str) or not self.device):
            raise _bad(own, "device", "None or a device name such as cpu or cuda:0", self.device)

    @property
    def judge_mode(self) -> str:
        """The mode used: ``mode``, or by default ``json`` with a URL, else ``constrained``."""
        return self.mode or ("constrained" if self.connection.local else "json")

    @classmethod
    def from_config(cls, cfg: Mapping, **overrides) -> JudgeOptions:
        """The judge settings of a run config or part of one (its ``judge`` section, ``scenarios``, ``device``;
        ``auto``: None; a missing key keeps the default), ``overrides`` (fields of any of the three classes,
        e.g. ``timeout=5``, ``backoff=0.1``) replacing its values."""
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
    """Run-config key -> judge setting: the three classes' ``KEYS``, ``scenarios`` and ``device``."""
    out = {path: name for c in (JudgeConnection, JudgeSampling, JudgeOptions) for name, path in c.KEYS.items()}
    return {**out, "scenarios": "scenarios", "device": "device"}
