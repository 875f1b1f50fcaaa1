"""Session caches: a prompt's keys/values kept for the next prompt of any session that starts alike.

A *session* is any hashable key a caller gives a row (a dialog agent's view of one episode).  :class:`SessionCache`
keeps, per session, its last prompt's token ids and keys/values, paged in **blocks** of ``block_size`` tokens (as the
block managers of vLLM and nano-vllm): a session's entry (:class:`Session`) is its token ids, its *block table* (the
:class:`Block` of each full block) and a private *tail* (its last, partial block).

A full block is keyed by ``(its parent's id, its token ids)``: found only under its whole chain of earlier tokens,
exactly, with no hash to collide (block ids are never reused; a session holding a block holds all before it).  The
pool holds each block once for all the engine's sessions, reference counted: ``store`` links the blocks already there
and copies only the others and the tail.  A prompt prefills only the tokens after the longest prefix it can reuse
(:meth:`SessionCache.lookup`).  A model pair's engines share one :class:`synclib.memory.CacheBudget`, counting each
block once; a session that does not fit is not stored.

Keys/values are kept per *layer group*, ``(Lg, 2, H, n, Dh)`` (layers, keys and values, heads, tokens, head dim): one
group of every layer where all have the same ``(H, Dh)``, else one per layer.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import count
from typing import Hashable, Sequence

__all__ = ["Block", "Session", "SessionCache", "common_prefix"]

#: the parent id of a prompt's first block
ROOT = -1


@dataclass(eq=False)
class Block:
    """``block_size`` tokens' keys/values in the pool: per layer group ``(Lg, 2, H, block_size, Dh)``."""

    id: int
    key: tuple       # (parent block's id or ROOT, tuple of its block_size token ids)
    kv: tuple
    nbytes: int
    refs: int = 0    # sessions holding it


@dataclass(eq=False)
class Session:
    """A session's entry: its prompt's token ids, the blocks of its full blocks (shared) and
    its tail (private, per layer group ``(Lg, 2, H, len(ids) - len(blocks) * block_size, Dh)``;
    None when empty).  ``nbytes``: the tail's bytes.  ``shared``: a chain of another
    session's blocks that :meth:`SessionCache.lookup` found (not an entry of the cache)."""

    ids: list
    blocks: list
    size: int        # tokens per block
    tail: tuple | None = None
    nbytes: int = 0
    shared: bool = False

    def pieces(self, p: int) -> list[tuple]:
        """The first ``p`` tokens' keys/values (``0 < p <= len(ids)``) as consecutive pieces over the blocks (and tail)
        they span: per layer group ``(Lg, 2, H, m, Dh)``, ``m`` at most a block's tokens."""
        full, rest = divmod(p, self.size)
        out = [b.kv for b in self.blocks[:full]]
        if rest:
            last = self.blocks[full].kv if full < len(self.blocks) else self.tail
            out.append(tuple(x[:, :, :, :rest] for x in last))
        return out

    def prefix(self, p: int) -> tuple:
        """The first ``p`` tokens' keys/values, one copied tensor per layer group ``(Lg, 2, H, p, Dh)``."""
        import torch

        return tuple(torch.cat(group, dim=3) for group in zip(*self.pieces(p)))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SessionCache:
    """The session caches of one engine in a pool of shared blocks, within a (possibly shared) budget.

    Parameters
    ----------
    budget : synclib.memory.CacheBudget
    enabled : bool, False: nothing is looked up or stored (the engine's ``kv_reuse=False``)
    stats : collections.Counter, the engine's counters (``cache_skips``)
    block_size : int, default 32
        Tokens per block: prompts share their keys/values in whole blocks.
    """

    def __init__(self, budget, enabled: bool, stats, block_size: int = 32):
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1 (tokens per block), got {block_size!r}")
        self.budget, self.enabled, self.stats, self.block_size = budget, enabled, stats, block_size
        self._sessions: OrderedDict = OrderedDict()
        self._blocks: dict = {}  # the pool: block key -> Block
        self._ids = count()  # the next block's id
        self._bytes = 0  # this engine's share of the budget: its blocks and tails
        self._skipped: dict = {}  # session -> token ids of the prompt the budget could not hold
        #: sessions whose prefix a prefill batch took over (:meth:`hand_over`)
        self.handed_over = 0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def nbytes(self) -> int:
        """Bytes held: each block once, and every session's tail."""
        return self._bytes

    @property
    def blocks(self) -> int:
        """Blocks in the pool."""
        return len(self._blocks)

    @property
    def shared_blocks(self) -> int:
        """Blocks that several sessions hold."""
        return sum(b.refs > 1 for b in self._blocks.values())

    def _chain(self, ids: Sequence[int], n_blocks: int) -> list[Block]:
        """The pool's blocks of the first (at most ``n_blocks``) full blocks of ``ids``, up to the first one missing."""
        size, chain, parent = self.block_size, [], ROOT
        for j in range(n_blocks):
            b = self._blocks.get((parent, tuple(ids[j * size:(j + 1) * size])))
            if b is None:
                break
            chain.append(b)
            parent = b.id
        return chain

    def lookup(self, ids: list, session) -> tuple[Session | None, int]:
        """The longest reusable prefix of ``ids`` (at most all but its last token) as ``(entry, length)``: the
        session's own entry (their common prefix) or, if longer, the pool's chain of full blocks ``ids`` starts with
        (an entry with ``shared``); ``(None, 0)`` when neither holds a token."""
        if not self.enabled or session is None:
            return None, 0
        own = self._sessions.get(session)
        n = min(common_prefix(ids, own.ids), len(ids) - 1) if own is not None else 0
        chain = self._chain(ids, (len(ids) - 1) // self.block_size)
        m = len(chain) * self.block_size
        if m > n:
            return Session(list(ids[:m]), chain, self.block_size, shared=True), m
        return own, n

    def touch(self, session) -> None:
        """Mark ``session`` as used now (if it holds an entry)."""
        if session in self._sessions:
            self._sessions.move_to_end(session)

    def new_tokens(self, ids: list, session) -> int:
        """Tokens of ``ids`` a prefill must run: those after the prefix :meth:`lookup` finds."""
        return len(ids) - self.lookup(ids, session)[1]

    def recomputed(self, ids: list, session) -> int:
        """Tokens of ``ids`` a session cache would have held had the budget had room."""
        old = self._skipped.get(session) if (self.enabled and session is not None) else None
        return min(common_prefix(ids, old), len(ids) - 1) if old is not None else 0

    def hand_over(self, sessions: Sequence[Hashable]) -> None:
        """Drop the entries of a prefill batch's sessions once it has copied their prefixes (each is stored anew
        after it, so one copy stays resident, not two); blocks other sessions hold stay."""
        for session in sessions:
            if session in self._sessions:
                self.forget(session)
                self.handed_over += 1

    def store(self, session, ids: list, kv: Sequence) -> None:
        """Keep ``kv`` (per layer: keys and values ``(1, H, len(ids), Dh)``, views are fine) as ``session``'s
        keys/values of ``ids`` if the budget has room: full blocks already in the pool are linked, the rest copied."""
        size = self.block_size
        n_full = len(ids) // size
        table = self._chain(ids, n_full)
        for b in table:  # linked before the session's old entry goes, which may hold them
            b.refs += 1
        self.forget(session)
        start = len(table) * size
        groups = _layer_groups(kv)
        per_token = sum(2 * k.shape[1] * k.shape[3] * k.element_size() for k, _ in kv)
        if not self.budget.take((len(ids) - start) * per_token):
            self._release(table)
            self.stats["cache_skips"] += 1
            self._skipped[session] = list(ids)
            return
        parent = table[-1].id if table else ROOT
        for j in range(len(table), n_full):
            block = Block(next(self._ids), (parent, tuple(ids[j * size:(j + 1) * size])),
                          _columns(kv, groups, j * size, (j + 1) * size), size * per_token, refs=1)
            self._blocks[block.key] = block
            table.append(block)
            parent = block.id
        rest = len(ids) - n_full * size
        tail = _columns(kv, groups, n_full * size, len(ids)) if rest else None
        self._sessions[session] = Session(list(ids), table, size, tail, rest * per_token)
        self._bytes += (len(ids) - start) * per_token

    def store_rows(self, rows: Sequence[tuple[list, Hashable]], cache) -> None:
        """Store each row of a prefilled batch in its session (:meth:`store`): left padded without holes, row ``i``'s
        tokens are its last ``len(ids)`` columns of ``cache``, a slice (no host wait, unlike a boolean mask)."""
        for i, (ids, session) in enumerate(rows):
            if session is None:
                continue
            n = len(ids)
            self.store(session, ids, [(layer.keys[i:i + 1, :, -n:], layer.values[i:i + 1, :, -n:])
                                      for layer in cache.layers])

    def _release(self, blocks: Sequence[Block]) -> None:
        """Drop a session's hold on ``blocks``; those no session holds leave the pool."""
        for b in blocks:
            b.refs -= 1
            if b.refs == 0:
                del self._blocks[b.key]
                self._bytes -= b.nbytes
                self.budget.give(b.nbytes)

    def forget(self, session: Hashable) -> None:
        """Drop the cached keys/values of ``session`` (its tail, and the blocks no other session holds)."""
        self._skipped.pop(session, None)
        s = self._sessions.pop(session, None)
        if s is not None:
            self._bytes -= s.nbytes
            self.budget.give(s.nbytes)
            self._release(s.blocks)

    def clear(self) -> None:
        """Drop every session cache and block."""
        self._sessions.clear()
        self._skipped.clear()
        self._blocks.clear()
        self.budget.give(self._bytes)
        self._bytes = 0


def _layer_groups(kv: Sequence) -> list[tuple[int, int]]:
    """Layer ``(first, end)`` ranges of ``kv``: one group if all share ``(H, Dh)`` and dtype, else one per layer."""
    shapes = {(k.shape[1], k.shape[3], k.dtype) for k, _ in kv}
    return [(0, len(kv))] if len(shapes) == 1 else [(i, i + 1) for i in range(len(kv))]


def _columns(kv: Sequence, groups: list[tuple[int, int]], a: int, b: int) -> tuple:
    """Columns ``a:b`` of per-layer ``kv`` (``(1, H, n, Dh)`` each) copied per layer group ``(Lg, 2, H, b - a, Dh)``."""
    import torch

    return tuple(torch.stack([x[0, :, a:b] for layer in kv[g0:g1] for x in layer]).unflatten(0, (g1 - g0, 2))
                 for g0, g1 in groups)
