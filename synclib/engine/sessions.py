"""Session caches: a prompt's keys/values kept for the next prompt of the same session.

A *session* is any hashable key a caller gives a row (a dialog agent's view of one episode).
:class:`SessionCache` keeps, per session, the token ids of its last prompt and their
keys/values (per layer ``(1, H, n, Dh)``, unpadded, on the model's device); the next prompt
of the session then prefills only the tokens after their longest common prefix.  The caches
of a model pair's engines share one :class:`synclib.memory.CacheBudget`: a session that does
not fit is not stored, and its next prompt is prefilled whole (dialog turns visit their
sessions in a cycle, so dropping the least recently used one would drop the one needed next).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable, Sequence

__all__ = ["Session", "SessionCache", "common_prefix"]


@dataclass
class Session:
    ids: list
    kv: list  # per layer: (keys (1, H, n, Dh), values (1, H, n, Dh))
    nbytes: int = 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SessionCache:
    """The session caches of one engine, within a (possibly shared) budget.

    Parameters
    ----------
    budget : synclib.memory.CacheBudget
    enabled : bool
        False: nothing is looked up or stored (the engine's ``kv_reuse=False``).
    stats : collections.Counter
        The engine's counters (``cache_skips``).
    """

    def __init__(self, budget, enabled: bool, stats):
        self.budget, self.enabled, self.stats = budget, enabled, stats
        self._sessions: OrderedDict = OrderedDict()
        self._bytes = 0  # this engine's share of the budget
        self._skipped: dict = {}  # session -> token ids of the prompt the budget could not hold
        #: sessions whose prefix a prefill batch took over (:meth:`hand_over`)
        self.handed_over = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def lookup(self, ids: list, session) -> tuple[Session | None, int]:
        """The session's entry and how many of ``ids`` it holds (at most all but one)."""
        s = self._sessions.get(session) if (self.enabled and session is not None) else None
        return s, (min(common_prefix(ids, s.ids), len(ids) - 1) if s is not None else 0)

    def touch(self, session) -> None:
        """Mark ``session`` as used now."""
        self._sessions.move_to_end(session)

    def new_tokens(self, ids: list, session) -> int:
        """Tokens of ``ids`` a prefill must run: those after the session's common prefix."""
        s = self._sessions.get(session) if (self.enabled and session is not None) else None
        return len(ids) - (common_prefix(ids, s.ids) if s is not None else 0)

    def recomputed(self, ids: list, session) -> int:
        """Tokens of ``ids`` a session cache would have held had the budget had room."""
        old = self._skipped.get(session) if (self.enabled and session is not None) else None
        return min(common_prefix(ids, old), len(ids) - 1) if old is not None else 0

    def hand_over(self, sessions: Sequence[Hashable], entries: Sequence) -> None:
        """Drop the entries a prefill batch has copied: the batch holds their prefixes now and
        each row's session is stored anew after it, so one copy stays resident, not two."""
        for session, s in zip(sessions, entries):
            if s is not None:
                self.forget(session)
                self.handed_over += 1

    def store(self, session, ids, kv) -> None:
        """Keep ``kv`` as ``session``'s keys/values of ``ids``, if the budget has room."""
        self.forget(session)
        nbytes = sum(k.numel() * k.element_size() * 2 for k, _ in kv)
        if not self.budget.take(nbytes):
            self.stats["cache_skips"] += 1
            self._skipped[session] = list(ids)
            return
        self._sessions[session] = Session(list(ids), kv, nbytes)
        self._bytes += nbytes

    def store_rows(self, rows: Sequence[tuple[list, Hashable]], cache) -> None:
        """Store each row of a prefilled batch in its session: its unpadded columns of ``cache``,
        copied so that the session owns its tensors.  A prefill batch is left padded without
        holes (:func:`~synclib.engine.prefill.layout`), so row ``i``'s tokens are its last
        ``len(ids)`` columns: a slice, which (unlike a boolean mask) makes the host wait for
        nothing."""
        for i, (ids, session) in enumerate(rows):
            if session is None:
                continue
            n = len(ids)
            kv = [(layer.keys[i:i + 1, :, -n:].clone(), layer.values[i:i + 1, :, -n:].clone())
                  for layer in cache.layers]
            self.store(session, ids, kv)

    def forget(self, session: Hashable) -> None:
        """Drop the cached keys/values of ``session``."""
        self._skipped.pop(session, None)
        s = self._sessions.pop(session, None)
        if s is not None:
            self._bytes -= s.nbytes
            self.budget.give(s.nbytes)

    def clear(self) -> None:
        """Drop every session cache."""
        self._sessions.clear()
        self._skipped.clear()
        self.budget.give(self._bytes)
        self._bytes = 0
