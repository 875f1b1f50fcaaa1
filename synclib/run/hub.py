"""The run's Hugging Face hub ids, checked before any GPU hour is spent.

``synclib run`` (dry or real) passes the config's model specs to :func:`check_models`, prints
:meth:`HubReport.lines` and, in the real run, stops on :meth:`HubReport.error`. An unknown id is named with the
nearest id the hub knows; a gated one says that its licence must be accepted and a token saved. When the hub
does not answer (no connection, a timeout, HTTP 5xx or 429) it is asked nothing more, and the remaining ids are
looked up in the local cache, as in offline mode (``HF_HUB_OFFLINE=1``, the compute nodes' setting).

The endpoint is huggingface_hub's (``HF_ENDPOINT``), imported inside the functions so that ``import
synclib.run.hub`` stays light. A saved token goes in huggingface_hub's headers; this module never prints it.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from synclib.models import EMBEDDED

__all__ = ["STATUSES", "is_hub_id", "ModelCheck", "HubReport", "check_models"]

#: what a check can say about one id (see :class:`ModelCheck`)
STATUSES = ("found", "gated", "unknown", "cached", "not cached", "unchecked")

_HUB_ID = re.compile(r"([A-Za-z0-9._-]+)/([A-Za-z0-9._-]+)")
#: difflib's ratio (ids lower-cased) below which no id is offered as the nearest
_CLOSE = 0.75
_LOGIN = "`hf auth login`"


def is_hub_id(spec: str) -> bool:
    """Whether a run config's model spec is a hub id: ``org/name`` (exactly one ``/``, both parts non-empty,
    of ``A-Z a-z 0-9 . _ -``, neither only dots) that is not an embedded short name
    (:data:`synclib.models.EMBEDDED`), a ``.gguf`` file or a local path that exists (relative to the cwd)."""
    if not isinstance(spec, str) or spec in EMBEDDED:
        return False
    m = _HUB_ID.fullmatch(spec)
    if m is None or any(set(part) == {"."} for part in m.groups()):
        return False
    if spec.lower().endswith(".gguf"):
        return False
    return not Path(spec).expanduser().exists()


@dataclass
class ModelCheck:
    """What the hub (or the local cache) says about one hub id. ``status``: ``found``; ``gated`` (licence to
    accept, token to save); ``unknown`` (no such repository, or a private one the token cannot see); ``cached``
    (hub not asked; config and weights cached); ``not cached`` (hub not asked or silent, and not cached);
    ``unchecked`` (neither could say). ``nearest``: for ``unknown``, the closest known id or None."""

    spec: str
    status: str
    nearest: str | None = None
    detail: str = ""


@dataclass
class HubReport:
    """The checks of a run's hub ids, in the run's order. ``reachable``: True when the hub answered every
    request, False when it did not (``reason`` says how), None when it was not asked (``reason`` says why)."""

    checks: list[ModelCheck]
    reachable: bool | None
    reason: str = ""
    endpoint: str = ""
    cache_dir: str = ""

    @property
    def unknown(self) -> list[ModelCheck]:
        """The checks the hub answered with "no such repository"."""
        return [c for c in self.checks if c.status == "unknown"]

    @property
    def not_cached(self) -> list[ModelCheck]:
        """The checks neither the hub confirmed nor the local cache holds."""
        return [c for c in self.checks if c.status == "not cached"]

    def lines(self) -> list[str]:
        """The dry run's text: a summary line, then ``ERROR:`` per unknown id, a line per gated id and a
        ``WARNING:`` per id neither the hub confirmed nor the cache holds ([] without hub ids)."""
        if not self.checks:
            return []
        n = Counter(c.status for c in self.checks)
        asked = n["found"] + n["gated"] + n["unknown"]
        local = [c for c in self.checks if c.status in ("cached", "not cached", "unchecked")]
        if self.reachable is None:
            head = (f"models: {_count(len(self.checks), 'hub id')} not checked on the hub "
                    f"({self.reason}); {self._cache_summary(local)}")
        elif self.reachable is False:
            before = f", {asked} checked before it stopped" if asked else ""
            head = (f"models: the hub at {self.endpoint} did not answer ({self.reason}): "
                    f"{_count(len(local), 'id')} not checked{before}; {self._cache_summary(local)}")
        else:
            parts = [f"{n['found']} found"] if n["found"] else []
            if n["gated"]:
                parts.append(f"{n['gated']} gated (accept the licence, {_LOGIN})")
            if n["unknown"]:
                parts.append(f"{n['unknown']} not on the hub")
            if n["unchecked"]:
                parts.append(f"{n['unchecked']} not checked")
            head = f"models: {_count(len(self.checks), 'hub id')} checked on {self.endpoint}: " + ", ".join(parts)
        return [head] + [line for c in self.checks for line in self._id_lines(c)]

    def _cache_summary(self, local: list[ModelCheck]) -> str:
        cached = sum(c.status == "cached" for c in local)
        where = f" ({self.cache_dir})" if self.cache_dir else ""
        return f"the local cache{where} holds {cached} of {len(local)}"

    def _id_lines(self, c: ModelCheck) -> list[str]:
        if c.status == "unknown":
            hint = (f"did you mean {c.nearest}?" if c.nearest
                    else f"nothing similar found; a private repository needs {_LOGIN}")
            return [f"  ERROR: {c.spec} is not on the hub ({hint})"]
        if c.status == "gated":
            url = f"{self.endpoint}/{c.spec}" if self.endpoint else "the hub"
            return [f"  {c.spec} is gated: accept its licence at {url}, then {_LOGIN}"
                    + (f" ({c.detail})" if c.detail else "")]
        if c.status == "not cached":
            return [f"  WARNING: {c.spec}: {c.detail or 'not in the local cache'}; "
                    f"download it where the hub answers (`hf download {c.spec}`)"]
        if c.status == "unchecked" or (c.status == "found" and c.detail):
            return [f"  {c.spec}: {c.detail}"]
        return []

    def error(self) -> str | None:
        """One message naming every id the hub does not know and its nearest known id; None when none."""
        bad = self.unknown
        if not bad:
            return None
        named = [f"{c.spec} (did you mean {c.nearest}?)" if c.nearest else f"{c.spec} (nothing similar found)"
                 for c in bad]
        return (f"{_count(len(bad), 'model id')} not on the hub at {self.endpoint or 'the hub'}: "
                + "; ".join(named) + f". Correct the run config's models (a private repository needs {_LOGIN}).")


def _count(k: int, noun: str) -> str:
    return f"{k} {noun}{'' if k == 1 else 's'}"


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else type(exc).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


# --------------------------------------------------------------------------- the local cache
def _cache_check(spec: str) -> ModelCheck:
    """``cached`` when the snapshot of ``refs/main`` holds ``config.json`` and every weight shard."""
    from huggingface_hub import try_to_load_from_cache

    try:
        config = try_to_load_from_cache(spec, "config.json")
        if not isinstance(config, str):
            return ModelCheck(spec, "not cached", detail="not in the local cache")
        snapshot = Path(config).parent
        missing = _missing_weights(snapshot)
    except (OSError, ValueError) as exc:  # an unreadable cache, or an id huggingface_hub refuses
        return ModelCheck(spec, "unchecked", detail=f"the local cache could not be read: {_first_line(exc)}")
    if missing:
        return ModelCheck(spec, "not cached", detail=f"its config.json is in the local cache, {missing}")
    return ModelCheck(spec, "cached", detail=f"in the local cache (revision {snapshot.name[:12]})")


def _missing_weights(snapshot: Path) -> str:
    """What of a cached snapshot's weights is missing ("" when nothing is)."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        f = snapshot / index
        if f.is_file():
            try:
                shards = sorted(set(json.loads(f.read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError):
                return f"its {index} is unreadable"
            absent = [s for s in shards if not (snapshot / s).is_file()]
            return f"{len(absent)} of its {len(shards)} weight shards are not" if absent else ""
    if any(snapshot.glob("*.safetensors")) or any(snapshot.glob("*.bin")):
        return ""
    return "its weights are not"


# --------------------------------------------------------------------------- the hub
class _Unreachable(Exception):
    """The hub did not answer (``reason``); ``offline``: huggingface_hub refused to ask it."""

    def __init__(self, reason: str, offline: bool = False):
        super().__init__(reason)
        self.reason, self.offline = reason, offline


def _transport_errors() -> tuple[type, ...]:
    """The connection errors of the HTTP clients huggingface_hub has imported (httpx2, httpx; else OSError)."""
    found = [OSError]
    for name in ("httpx2", "httpx"):
        mod = sys.modules.get(name)
        if mod is not None and isinstance(getattr(mod, "TransportError", None), type):
            found.append(mod.TransportError)
    return tuple(found)


def _unreachable(exc: Exception, timeout: float) -> _Unreachable | None:
    """The hub-did-not-answer form of ``exc`` (None when ``exc`` is an answer about one id)."""
    from huggingface_hub.utils import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(exc, OfflineModeIsEnabled):
        return _Unreachable("HF_HUB_OFFLINE is set: huggingface_hub does not contact the hub", offline=True)
    if isinstance(exc, HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status is not None and (status >= 500 or status == 429):
            said = (getattr(exc, "server_message", None) or "").strip().splitlines()
            return _Unreachable(f"HTTP {status}" + (f": {said[0][:120]}" if said else ""))
        return None
    if isinstance(exc, _transport_errors()):
        names = {k.__name__ for k in type(exc).__mro__}
        if any("Timeout" in k for k in names):
            return _Unreachable(f"no answer within {timeout:g} s")
        if "ProtocolError" not in names and names & {"ConnectError", "ConnectionError", "OSError"}:
            return _Unreachable(f"could not connect: {_first_line(exc)}")
        return _Unreachable(f"the connection broke: {_first_line(exc)}")
    return None


class _Hub:
    """One check's requests (searches remembered per query); ``broken`` is set when the hub stopped answering
    during a search or auth check (the id's own answer stands, no more are asked)."""

    def __init__(self, timeout: float):
        from huggingface_hub import HfApi, constants, get_token

        self.api, self.timeout, self.endpoint = HfApi(), timeout, constants.ENDPOINT
        self.has_token = bool(get_token())  # whether one is saved; the token itself is not kept
        self.listed: dict[tuple, list[str]] = {}
        self.broken = ""

    def _get(self, path: str, params: dict | None = None):
        """``GET {endpoint}{path}`` within the timeout (``list_models``/``auth_check`` take none, retry for long)."""
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        try:
            r = get_session().get(f"{self.endpoint}{path}", params=params or {},
                                  headers=build_hf_headers(), timeout=self.timeout)
            hf_raise_for_status(r)
        except Exception as exc:
            why = _unreachable(exc, self.timeout)
            if why is None:
                raise
            raise why from exc
        try:
            return r.json()
        except ValueError as exc:  # a page that is not the hub's JSON
            raise _Unreachable(f"the answer is not the hub's API: {_first_line(exc)}") from exc

    def ask(self, spec: str) -> ModelCheck:
        """What the hub says about ``spec``; raises :class:`_Unreachable` when it does not answer."""
        from huggingface_hub.utils import DisabledRepoError, GatedRepoError, HfHubHTTPError, \
            HFValidationError, RepositoryNotFoundError

        try:
            info = self.api.model_info(spec, timeout=self.timeout)
        except GatedRepoError as exc:
            return self._gated(spec, f"HTTP {getattr(exc.response, 'status_code', '?')}: access is restricted")
        except DisabledRepoError:
            return self._unknown(spec, "the hub has disabled this repository")
        except RepositoryNotFoundError as exc:
            status = getattr(exc.response, "status_code", "?")
            return self._unknown(spec, f"HTTP {status}: no such repository, or a private one"
                                       + ("" if self.has_token else " (no token is saved)"))
        except HFValidationError as exc:
            return self._unknown(spec, f"not a valid hub id: {_first_line(exc)}")
        except HfHubHTTPError as exc:
            why = _unreachable(exc, self.timeout)
            if why is not None:
                raise why from exc
            status = getattr(exc.response, "status_code", None)
            said = f"{exc} {getattr(exc, 'server_message', '') or ''}".lower()
            if status in (401, 403) and "gated" in said:
                return self._gated(spec, f"HTTP {status}: gated")
            if status in (401, 403, 404):
                return self._unknown(spec, f"HTTP {status}: no such repository, or a private one")
            return ModelCheck(spec, "unchecked", detail=f"the hub answered HTTP {status}: {_first_line(exc)}")
        except (ValueError, KeyError, TypeError) as exc:  # a 200 whose body is not the hub's
            raise _Unreachable(f"the answer is not the hub's API: {_first_line(exc)}") from exc
        except Exception as exc:
            why = _unreachable(exc, self.timeout)
            if why is None:
                raise
            raise why from exc
        if getattr(info, "gated", None):
            return self._gated(spec, "")
        known = getattr(info, "id", None) or spec
        return ModelCheck(spec, "found", detail="" if known == spec else f"the hub now calls it {known}")

    def _gated(self, spec: str, detail: str) -> ModelCheck:
        """A gated id; with a saved token, the hub's auth check says whether it has access."""
        if not self.has_token:
            return ModelCheck(spec, "gated", detail=detail or "no token is saved")
        from huggingface_hub.utils import HfHubHTTPError

        try:
            self._get(f"/api/models/{spec}/auth-check")
        except _Unreachable as exc:
            self.broken = exc.reason
            return ModelCheck(spec, "gated", detail=detail)
        except HfHubHTTPError as exc:
            status = getattr(exc.response, "status_code", "?")
            return ModelCheck(spec, "gated", detail=f"the saved token has no access (HTTP {status})")
        return ModelCheck(spec, "found", detail="gated; the saved token has access")

    def _unknown(self, spec: str, detail: str) -> ModelCheck:
        return ModelCheck(spec, "unknown", nearest=self.nearest(spec), detail=detail)

    def nearest(self, spec: str) -> str | None:
        """The id closest to ``spec`` (:mod:`difflib`) among the author's models holding the name's first word,
        then all the author's, then any author's holding that word (a misspelt author); None when none is close."""
        from huggingface_hub.utils import HfHubHTTPError

        author, name = spec.split("/", 1)
        stem = re.split(r"[-_.]", name)[0] or name
        queries = ({"author": author, "search": stem, "limit": 200}, {"author": author, "limit": 1000},
                   {"search": stem, "sort": "downloads", "limit": 200})
        for params in queries:
            key = tuple(sorted(params.items()))
            if key not in self.listed:
                try:
                    found = self._get("/api/models", params)
                except _Unreachable as exc:
                    self.broken = exc.reason
                    return None
                except HfHubHTTPError:  # a refused search only means no suggestion
                    found = []
                self.listed[key] = [m["id"] for m in found if isinstance(m, dict) and isinstance(m.get("id"), str)] \
                    if isinstance(found, list) else []
            ids = {i.lower(): i for i in self.listed[key] if i != spec}
            close = difflib.get_close_matches(spec.lower(), list(ids), n=1, cutoff=_CLOSE)
            if close:
                return ids[close[0]]
        return None


def _offline_setting() -> bool:
    """huggingface_hub's offline mode, or ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` set since its import."""
    from huggingface_hub import constants

    now = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return bool(constants.HF_HUB_OFFLINE) or now.upper() in {"1", "ON", "YES", "TRUE"}


def check_models(specs, *, timeout: float = 5.0, offline: bool | None = None) -> HubReport:
    """A :class:`ModelCheck` per hub id among ``specs`` (:func:`is_hub_id`; each once, in order), from the hub or,
    where it is not asked, the local cache.

    ``timeout``: seconds per request; the first request the hub does not answer ends the asking, so an
    unreachable hub costs about one timeout (plus up to 3 s for huggingface_hub 2.x's agent-harness registry,
    unless cached in the last day or ``HF_HUB_DISABLE_TELEMETRY`` is set). ``offline``: True looks only in
    the cache; None follows ``HF_HUB_OFFLINE``.
    """
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    ids = list(dict.fromkeys(s for s in specs if is_hub_id(s)))
    if not ids:
        return HubReport([], reachable=None, reason="no hub ids to check")
    from huggingface_hub import constants

    where = {"endpoint": constants.ENDPOINT, "cache_dir": str(constants.HF_HUB_CACHE)}
    if offline is None and _offline_setting():
        return HubReport([_cache_check(s) for s in ids], None, "HF_HUB_OFFLINE is set: the hub was not asked", **where)
    if offline:
        return HubReport([_cache_check(s) for s in ids], None,
                         "offline mode, as HF_HUB_OFFLINE=1 sets it: the hub was not asked", **where)
    hub, checks = _Hub(timeout), []
    for i, spec in enumerate(ids):
        try:
            checks.append(hub.ask(spec))
        except _Unreachable as exc:
            return HubReport(checks + [_cache_check(s) for s in ids[i:]], None if exc.offline else False,
                             exc.reason, **where)
        if hub.broken:
            return HubReport(checks + [_cache_check(s) for s in ids[i + 1:]], False, hub.broken, **where)
    return HubReport(checks, True, **where)
