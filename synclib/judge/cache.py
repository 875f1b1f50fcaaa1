"""The answer cache: a JSON-lines file keyed on ``sha256(judge id, full request)``, appended after every answer."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from synclib.judge.errors import JudgeError

__all__ = ["JudgeCache", "cache_key"]

log = logging.getLogger(__name__)


def cache_key(judge_id: str, request: Any) -> str:
    """``sha256`` of the judge id and the full request (messages or prompt)."""
    blob = json.dumps([judge_id, request], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgeCache:
    """Append-only, thread-safe JSON-lines cache of judge answers.

    Each line ``{"key": sha256, "judge": id, "value": ...}`` is fsynced as soon as its answer arrives.  A torn
    last line (no final newline) is cut off on load, with a warning; any other unreadable line raises
    :class:`JudgeError` naming the file and line.

    Parameters
    ----------
    path : path or None
        The file; None keeps the cache in memory only.
    """

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path is not None else None
        self._data: dict[str, Any] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.exists():
            self._load()

    def _load(self) -> None:
        raw = self.path.read_bytes()
        complete, _, torn = raw.rpartition(b"\n")
        if torn:  # the last line never got its newline: the write was cut off
            with open(self.path, "r+b") as f:
                f.truncate(len(complete) + 1 if complete else 0)
            log.warning("%s: cut off a torn last line (%d bytes) left by an interrupted write; "
                        "its answer will be asked again", self.path, len(torn))
        for n, line in enumerate(complete.decode("utf-8", errors="replace").split("\n") if complete else [], 1):
            try:
                rec = json.loads(line)
                self._data[rec["key"]] = rec["value"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise JudgeError(f"{self.path}:{n}: damaged judge cache line ({type(exc).__name__}); "
                                 "fix or delete that line, or move the file away to start over") from None

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def get(self, key: str) -> Any:
        return self._data.get(key)

    def put(self, key: str, judge_id: str, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            if self.path is None:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"key": key, "judge": judge_id, "value": value}, ensure_ascii=False)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())

