"""The ``<output>.done.json`` stamps of finished jobs, holding the fingerprint of the inputs each output was
made from (written by :mod:`synclib.run.pipeline`, read by :mod:`synclib.run.plan`), and the output's lock."""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path


def stamp_path(output: Path) -> Path:
    """``<output>.done.json``."""
    return output.with_name(output.name + ".done.json")


def read_stamp(output: Path) -> dict | None:
    """The stamp of a finished ``output``, or None (missing or torn)."""
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


@contextmanager
def output_lock(output: Path, say=print):
    """Hold ``<output>.lock`` (a POSIX record lock, honoured by NFS and clusters' file systems) while the
    block runs, so one process at a time makes an output.  A second process (a stopped worker still alive,
    two array tasks naming the same run) waits, saying so once with the holder's host and pid, until the
    first ends (the kernel drops a dead process's locks); it then finds the output stamped or resumes it."""
    lock = output.with_name(output.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            say(f"[synclib] waiting for {holder}, which still writes {output.name}")
            fcntl.lockf(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"{socket.gethostname()} pid {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            fcntl.lockf(f, fcntl.LOCK_UN)
