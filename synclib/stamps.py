"""The ``*.done.json`` stamps of finished jobs: one beside each job's output, holding the
fingerprint of the inputs it was made from (:mod:`synclib.run.pipeline` writes them,
:mod:`synclib.run.plan` reads them for the dry run)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def stamp_path(output: Path) -> Path:
    """Where the stamp of ``output`` lives: ``<output>.done.json``."""
    return output.with_name(output.name + ".done.json")


def read_stamp(output: Path) -> dict | None:
    """The ``*.done.json`` stamp of a finished job's output, or None (missing or torn)."""
    stamp = stamp_path(output)
    if not (output.exists() and stamp.exists()):
        return None
    try:
        return json.loads(stamp.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def up_to_date(output: Path, fp: str) -> bool:
    """Whether ``output`` is finished and was made from inputs with fingerprint ``fp``."""
    stamp = read_stamp(output)
    return stamp is not None and stamp.get("fingerprint") == fp


def mark_done(output: Path, fp: str, **info) -> None:
    """Write the stamp of a finished ``output`` (atomically: a torn stamp is never read)."""
    stamp = stamp_path(output)
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps({"fingerprint": fp, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **info},
                              indent=1, default=str))
    os.replace(tmp, stamp)
