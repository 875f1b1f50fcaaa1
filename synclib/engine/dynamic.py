"""Decoding rows in one growing batch: the cache and mask gain a column per step, finished rows leave.

:class:`DynamicRows` is the row store of the ``"dynamic"`` decoding mode (the CPU's), with the interface of
:class:`~synclib.engine.fixed.FixedSlots` (``add``, ``logits_of``, ``keep``, ``feed``): rows that join are merged in
left-padded (:func:`~synclib.engine.prefill.merge_prefills`), rows that leave are selected out, and each step is one
forward pass whose cache grows by a column.  :func:`with_room` gives a CPU batch's cache room for its reply, so that
a step writes in place instead of allocating every layer anew.
"""
from __future__ import annotations

import numpy as np

from synclib.engine.forward import forward
from synclib.engine.prefill import Prefill, merge_prefills

__all__ = ["DynamicRows", "with_room"]


class DynamicRows:
    """Rows as one growing batch; positions are the rows' order in the batch.

    Parameters
    ----------
    engine : Engine
        Whose model runs the steps and whose ``stats`` count them (``forward_calls``).
    stats : collections.Counter
        Where leaves that drop columns are counted (``trims``: a stream's own counters).
    room : int, optional
        Give the first prefill's cache room for this many steps (:func:`with_room`).
    trim : bool, default True
        When rows leave, drop the leading columns no remaining row attends to.
    """

    #: finished rows leave the batch (fixed slots keep theirs until the batch ends)
    compacts = True

    @staticmethod
    def worth_keeping(going: int, rows: int) -> bool:
        """Whether a batch of ``rows`` rows, ``going`` still decoding, should keep only those: once half finished.
        A finished row left in costs its share of each step's attention; compacting copies every remaining row's
        cache (about twice a step's attention), so at half a batch compacts at most ``log2(rows)`` times."""
        return going <= rows // 2

    def __init__(self, engine, stats, room: int | None = None, trim: bool = True):
        self.engine, self.stats, self.pre = engine, stats, None
        self.room, self.trim = room, trim

    def add(self, pre: Prefill) -> list[int]:
        """Add a prefilled group after the rows already here; their positions."""
        B0 = 0 if self.pre is None else self.pre.mask.shape[0]
        if self.pre is None:
            self.pre = pre
            if self.room:
                with_room(pre.cache, self.room)
        else:
            self.pre.states = np.zeros((B0,) + pre.states.shape[1:], dtype=pre.states.dtype)  # kept per row
            self.pre = merge_prefills([self.pre, pre], [list(range(B0)), list(range(B0, B0 + len(pre.reused)))])
        return list(range(B0, B0 + pre.mask.shape[0]))

    def logits_of(self, pos: list[int]):
        """The next-token logits ``(len(pos), V)`` of the rows at ``pos``."""
        return self.pre.logits if pos == list(range(self.pre.mask.shape[0])) else self.pre.logits[pos]

    def keep(self, pos: list[int]) -> list[int]:
        """Keep the rows at ``pos`` (in that order), drop the others; their new positions."""
        import torch

        if not pos:
            self.pre = None
            return []
        if len(pos) < self.pre.mask.shape[0]:
            pre = self.pre
            idx = torch.tensor(pos, device=pre.mask.device)
            pre.cache.batch_select_indices(idx)
            pre.mask, pre.next_pos, pre.logits = pre.mask[idx], pre.next_pos[idx], pre.logits[idx]
            if self.trim:
                self._trim()
        return list(range(len(pos)))

    def _trim(self) -> None:
        """Drop the leading columns no remaining row attends to (left by rows that left)."""
        pre = self.pre
        used = pre.mask.any(0).nonzero()
        first = int(used[0]) if used.numel() else 0
        if first == 0 or first < pre.mask.shape[1] // 4:  # not worth a copy yet
            return
        for layer in pre.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, first:].contiguous(), layer.values[:, :, first:].contiguous()
        pre.mask = pre.mask[:, first:]
        self.stats["trims"] += 1

    def columns(self):
        """``(layers, mask, ends)`` of every row (:func:`~synclib.engine.probes.score_points`): the cache's
        ``(keys, values)`` per layer, the ``(B, T)`` mask, and each row's end column (``T`` for all)."""
        import torch

        pre = self.pre
        B, T = pre.mask.shape
        return ([(layer.keys, layer.values) for layer in pre.cache.layers], pre.mask,
                torch.full((B,), T, dtype=torch.long, device=pre.mask.device))

    def feed(self, pos: list[int], tok) -> None:
        """One forward pass over every row (``pos`` is all of them, in order) fed ``tok``."""
        import torch

        pre = self.pre
        pre.mask = torch.cat([pre.mask, pre.mask.new_ones((len(pos), 1))], dim=1)
        with torch.inference_mode():
            logits, pre.cache = forward(self.engine.lm.model, tok.unsqueeze(-1), pre.mask, pre.next_pos.unsqueeze(-1),
                                        pre.cache, last_only=True)
        pre.logits, pre.next_pos = logits[:, -1, :].float(), pre.next_pos + 1
        self.engine.stats["forward_calls"] += 1


def with_room(cache, room: int) -> None:
    """Give a prefilled ``DynamicCache`` room for ``room`` more tokens per row, in place.

    ``transformers`` grows a layer's keys and values by concatenation, allocating each layer's ``(B, H, T + 1, Dh)``
    anew every step; on the CPU, where large freed blocks go back to the system
    (:func:`synclib.memory.return_freed_memory`), those are fresh pages to fault in and zero.  Here each layer's keys
    and values move once into buffers with ``room`` spare columns and a step writes its column in place (the layer's
    ``keys``/``values`` are views of the same values).  Only plain ``DynamicLayer`` layers are converted (the engine's
    only kind); a row selection keeps the room.
    """
    from transformers.cache_utils import DynamicLayer

    roomy = _roomy_layer()
    for layer in getattr(cache, "layers", ()):  # transformers < 4.56 keeps lists, left as they are
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
            layer.__class__ = roomy
            layer._room = int(room)
            layer._place(layer.keys, layer.values)


_ROOMY = []  # the layer class of with_room, defined on first use (transformers is a lazy import)


def _roomy_layer():
    if _ROOMY:
        return _ROOMY[0]
    from transformers.cache_utils import DynamicLayer

    class RoomyLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys/values are the first ``T`` columns of buffers with room."""

        def _place(self, keys, values) -> None:
            B, H, T, D = keys.shape
            self._kb = keys.new_empty((B, H, T + self._room, D))
            self._vb = values.new_empty((B, H, T + self._room, values.shape[-1]))
            self._kb[:, :, :T], self._vb[:, :, :T] = keys, values
            self.keys, self.values = self._kb[:, :, :T], self._vb[:, :, :T]

        def update(self, key_states, value_states, *args, **kwargs):
            T, n = self.keys.shape[-2], key_states.shape[-2]
            if T + n > self._kb.shape[-2]:  # out of room: move into new buffers
                self._place(self.keys, self.values)
            self._kb[:, :, T:T + n], self._vb[:, :, T:T + n] = key_states, value_states
            self.keys, self.values = self._kb[:, :, :T + n], self._vb[:, :, :T + n]
            return self.keys, self.values

        def batch_select_indices(self, indices) -> None:
            T = self.keys.shape[-2]
            self._kb, self._vb = self._kb[indices], self._vb[indices]
            self.keys, self.values = self._kb[:, :, :T], self._vb[:, :, :T]

    _ROOMY.append(RoomyLayer)
    return RoomyLayer
