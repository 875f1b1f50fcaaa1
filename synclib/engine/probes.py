"""Candidate scoring inside a decoding stream: a row's read-outs at points of its own reply.

A :class:`Probe` asks a :class:`~synclib.engine.DecodeStream` row to score token sequences (as
:meth:`Engine.sequence_logprobs`) at its prompt's end (``first``) and after the first generated token that ``mark``
accepts among its first ``within`` (``then``).  Both points' keys/values are already in the stream's row store: a
point is the row's open columns up to its context plus one *anchor* token (the prompt's last token, or the marked
token), each sequence fed as ``(anchor, *sequence)`` in one prefix tree over those columns
(:func:`~synclib.engine.candidates.continuation_logprobs`), so ``log P(sequence | context, anchor)`` is a solo run's
up to float rounding.  A stream scores every waiting point in one batched forward (:func:`score_points`) at the step
where a row that has some ends, before its keys/values leave the row store.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np

from synclib.engine.candidates import continuation_logprobs
from synclib.engine.forward import index_tensor

__all__ = ["Probe", "Point", "score_points"]


@dataclass(frozen=True)
class Probe:
    """What a stream row scores at two points of its reply (see the module).

    Attributes
    ----------
    first : tuple of S1 non-empty token tuples
        Scored right after the prompt: ``log P(seq | prompt)``.
    then : tuple of S2 token tuples, default ()
        Scored after the first generated token ``mark`` accepts: ``log P(seq | prompt, reply up to that token)``.
    mark : callable int -> bool, optional
        Which generated token (kept in the reply) opens the second point.
    within : int, default 16
        The second point opens only at one of the reply's first ``within`` tokens.
    """

    first: tuple
    then: tuple = ()
    mark: Callable[[int], bool] | None = None
    within: int = 16

    def __post_init__(self):
        for name in ("first", "then"):
            for j, seq in enumerate(getattr(self, name)):
                if not len(seq):
                    raise ValueError(f"Probe.{name}[{j}] is empty (no tokens)")
        if self.then and self.mark is None:
            raise ValueError("Probe.then needs Probe.mark (which token opens the second point)")
        if int(self.within) < 1:
            raise ValueError(f"Probe.within must be >= 1, got {self.within}")


@dataclass
class Point:
    """One point of a row to score: its first ``context`` tokens (prompt and reply) are the
    context, ``anchor`` the token after them; ``which`` is 0 (``Probe.first``) or 1 (``Probe.then``)."""

    row: object
    context: int
    anchor: int
    which: int

    @property
    def seqs(self) -> tuple:
        probe = self.row.probe
        return probe.first if self.which == 0 else probe.then


def score_points(model, view, points: list[Point], pad_token_id: int, batch_size: int
                 ) -> tuple[list[np.ndarray], int]:
    """Score ``points`` over a row store's keys/values, ``batch_size`` points per forward.

    Parameters
    ----------
    model : transformers causal LM
    view : (layers, mask, ends)
        The row store's columns (:meth:`DynamicRows.columns`, :meth:`FixedSlots.columns`): ``layers`` a list of
        ``(keys, values)`` of ``(B, H, T, Dh)``; ``mask`` ``(B, T)`` long, its open columns; ``ends`` ``(B,)`` long,
        the column after each position's last written one.  A row's open columns are contiguous and hold its prompt
        and the tokens fed so far, so the last ``len(prompt) + row.fed - context`` of them are closed for a point.
    points : list of Point
        ``point.row`` has ``pos`` (its position in the store), ``ids`` (prompt ids), ``fed`` and ``probe``.
    pad_token_id, batch_size : int

    Returns
    -------
    logps : list of numpy.ndarray
        Per point, float64 of shape ``(len(point.seqs),)``.
    forward_calls : int
    """
    import torch

    layers, mask, ends = view
    dev, T = mask.device, mask.shape[1]
    out, calls = [], 0
    for c0 in range(0, len(points), max(1, int(batch_size))):
        chunk = points[c0:c0 + max(1, int(batch_size))]
        sel = index_tensor([p.row.pos for p in chunk], dev)
        drop = index_tensor([len(p.row.ids) + p.row.fed - p.context for p in chunk], dev)
        end = ends.index_select(0, sel) - drop  # (n,) the anchor's column
        cut = mask.index_select(0, sel) * (torch.arange(T, device=dev)[None, :] < end[:, None])
        cache = SimpleNamespace(layers=[SimpleNamespace(keys=k.index_select(0, sel), values=v.index_select(0, sel))
                                        for k, v in layers])
        items = [(j, (p.anchor,) + tuple(seq)) for j, p in enumerate(chunk) for seq in p.seqs]
        anchor_pos = index_tensor([p.context for p in chunk], dev)
        logps, n = continuation_logprobs(model, cache, cut, anchor_pos, items, pad_token_id, len(chunk), ends=end)
        calls += n
        k = 0
        for p in chunk:
            out.append(np.array(logps[k:k + len(p.seqs)], dtype=np.float64))
            k += len(p.seqs)
    return out, calls
